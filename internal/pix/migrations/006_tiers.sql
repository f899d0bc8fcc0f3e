-- Tiers: named sets of route limits (0: the deployment's default), the accounts moved off their
-- person's tier (pf, pj) or given overrides of their own, and a version that moves on every
-- change, which replicas poll to reload the table within a second.
CREATE TABLE tiers (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9-]{0,31}$'),
    pix_limit       integer NOT NULL DEFAULT 0 CHECK (pix_limit BETWEEN 0 AND 1000000),
    statement_limit integer NOT NULL DEFAULT 0 CHECK (statement_limit BETWEEN 0 AND 1000000),
    lookup_capacity integer NOT NULL DEFAULT 0 CHECK (lookup_capacity BETWEEN 0 AND 1000000)
);
INSERT INTO tiers (name, pix_limit, statement_limit, lookup_capacity) VALUES
    ('pf', 0, 0, 0), ('pj', 0, 0, 0), ('premium', 30, 120, 0), ('restricted', 5, 10, 20);

CREATE TABLE account_tiers (
    account_id      text PRIMARY KEY REFERENCES accounts (id),
    tier            text NOT NULL REFERENCES tiers (name),
    pix_limit       integer NOT NULL DEFAULT 0 CHECK (pix_limit BETWEEN 0 AND 1000000),
    statement_limit integer NOT NULL DEFAULT 0 CHECK (statement_limit BETWEEN 0 AND 1000000),
    lookup_capacity integer NOT NULL DEFAULT 0 CHECK (lookup_capacity BETWEEN 0 AND 1000000)
);

CREATE TABLE tier_version (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    version bigint NOT NULL
);
INSERT INTO tier_version VALUES (true, 1);
