-- Money limits the customer sets (Res. BCB 142/2021): the values in force, NULL for the bank's
-- default; night_start in minutes since midnight.
CREATE TABLE account_limits (
    account_id        text PRIMARY KEY REFERENCES accounts (id),
    night_limit_cents bigint CHECK (night_limit_cents >= 0),
    day_limit_cents   bigint CHECK (day_limit_cents >= 0),
    night_start       integer CHECK (night_start IN (1200, 1320))
);

-- Increases the customer asked for, one per field, applied from effective_at (never earlier):
-- a row whose effective_at has passed is in force, whether or not it was folded into
-- account_limits yet. value is cents, or minutes since midnight for night_start.
CREATE TABLE pending_limits (
    account_id   text NOT NULL REFERENCES accounts (id),
    field        text NOT NULL CHECK (field IN ('night_limit_cents', 'day_limit_cents', 'night_start')),
    value        bigint NOT NULL CHECK (value >= 0),
    effective_at timestamptz NOT NULL,
    PRIMARY KEY (account_id, field)
);

-- Devices registered for PIX under the customer's strong authentication (the central bank's
-- new-device rule of 2024); any other device sends under the new-device caps.
CREATE TABLE devices (
    account_id    text NOT NULL REFERENCES accounts (id),
    device_id     text NOT NULL,
    registered_at timestamptz NOT NULL,
    PRIMARY KEY (account_id, device_id)
);

-- Whether a transfer was sent from a registered device: the new-device day cap sums the others.
-- Transfers made before this migration count as registered.
ALTER TABLE transfers ADD COLUMN from_registered_device boolean NOT NULL DEFAULT true;
