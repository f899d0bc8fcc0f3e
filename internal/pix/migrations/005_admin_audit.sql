-- The support desk's audit trail: every call, authorized or not. key is the rate-limit key as
-- the limiter hashes it (never a CPF, account or address in clear); before and after are the
-- key's state as JSON.
CREATE TABLE admin_audit (
    seq    bigserial PRIMARY KEY,
    at     timestamptz NOT NULL,
    actor  text NOT NULL,
    action text NOT NULL,
    status integer NOT NULL,
    policy text NOT NULL,
    key    text NOT NULL,
    before text NOT NULL,
    after  text NOT NULL
);
