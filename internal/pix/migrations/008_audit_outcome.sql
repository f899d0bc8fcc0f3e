-- A change made by the support desk is recorded twice: "requested" before it is made, and
-- "done" or "failed" after, the two rows sharing a request id; a read is one "done" row. Calls
-- without the right token are summarized: one row per client IP per minute, "refused", with
-- how many calls it stands for.
ALTER TABLE admin_audit
    ADD COLUMN outcome text NOT NULL DEFAULT 'done',
    ADD COLUMN request text NOT NULL DEFAULT '',
    ADD COLUMN calls integer NOT NULL DEFAULT 1;
