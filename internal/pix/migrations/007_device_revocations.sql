-- When support last revoked an account's trusted devices (the support desk's DELETE
-- /admin/v1/accounts/{id}/devices): the access and device tokens issued before it are no longer
-- honoured, and its devices registered for PIX were deleted then. Part of the table the
-- replicas poll (tier_version moves with it).
CREATE TABLE device_revocations (
    account_id text PRIMARY KEY REFERENCES accounts (id),
    revoked_at timestamptz NOT NULL
);
