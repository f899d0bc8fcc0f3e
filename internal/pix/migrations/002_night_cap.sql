-- The night-time cap sums a payer's transfers since the night began: one index range scan.
CREATE INDEX transfers_payer_time ON transfers (payer_id, created_at);
