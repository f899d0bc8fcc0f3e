-- A tier may put its accounts' PIX on a queue (leaky_bucket) of pix_queue places, paced at the
-- tier's PIX limit (0: the route's own algorithm): a company's payroll goes through at a steady
-- pace instead of being refused past its limit. The payroll tier is the support desk's for it.
ALTER TABLE tiers ADD COLUMN pix_queue integer NOT NULL DEFAULT 0 CHECK (pix_queue BETWEEN 0 AND 100000);
INSERT INTO tiers (name, pix_limit, statement_limit, lookup_capacity, pix_queue) VALUES ('payroll', 60, 0, 0, 30);
UPDATE tier_version SET version = version + 1;
