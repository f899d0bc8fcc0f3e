-- The ledger: accounts with their balances, PIX keys, transfers and the two entries of each.
-- Money is bigint cents; a balance can never go below zero, whatever the code above does.

CREATE TABLE accounts (
    id            text PRIMARY KEY,
    name          text NOT NULL,
    document      char(11) NOT NULL UNIQUE,
    password_hash text NOT NULL,
    balance_cents bigint NOT NULL CHECK (balance_cents >= 0)
);

CREATE TABLE pix_keys (
    key        text PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts (id)
);

-- One row per transfer. It is also the idempotency record: (payer_id, idempotency_key) is
-- unique, so a replay on any replica finds the original, and two concurrent requests with one
-- key cannot both commit.
CREATE TABLE transfers (
    end_to_end_id       char(32) PRIMARY KEY,
    payer_id            text NOT NULL REFERENCES accounts (id),
    payee_id            text NOT NULL REFERENCES accounts (id),
    to_key              text NOT NULL,
    amount_cents        bigint NOT NULL CHECK (amount_cents > 0),
    description         text NOT NULL,
    idempotency_key     text,
    payer_balance_after bigint NOT NULL,
    created_at          timestamptz NOT NULL,
    UNIQUE (payer_id, idempotency_key)
);

-- Each transfer seen from each side, so a statement is one index range scan.
CREATE TABLE entries (
    seq           bigserial PRIMARY KEY,
    account_id    text NOT NULL REFERENCES accounts (id),
    end_to_end_id char(32) NOT NULL REFERENCES transfers (end_to_end_id),
    direction     text NOT NULL CHECK (direction IN ('in', 'out')),
    amount_cents  bigint NOT NULL CHECK (amount_cents > 0),
    counterparty  text NOT NULL,
    description   text NOT NULL,
    created_at    timestamptz NOT NULL,
    UNIQUE (account_id, end_to_end_id)
);

CREATE INDEX entries_statement ON entries (account_id, created_at DESC, seq DESC);
