-- A device asks to be registered for PIX; while the account has another registered device, it
-- waits until pending_until (DEVICE_REGISTRATION_DELAY), unless a registered device approves it
-- first (pending_until set to NULL) or it is removed. NULL: registered. A device removed by its
-- owner is listed in removed_devices: its access tokens issued before then are refused, and the
-- replicas learn it with the tier table (tier_version moves).
ALTER TABLE devices ADD COLUMN pending_until timestamptz;
CREATE TABLE removed_devices (
    account_id text NOT NULL REFERENCES accounts (id),
    device_id  text NOT NULL,
    removed_at timestamptz NOT NULL,
    PRIMARY KEY (account_id, device_id)
);
