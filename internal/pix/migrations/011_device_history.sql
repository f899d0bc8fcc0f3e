-- Whether the account has ever had a device registered for PIX. Only the account's first
-- registered device ever registers at once; after it, and after the support desk revoked them all
-- or their owner removed them (which delete the devices' rows), every registration waits
-- DEVICE_REGISTRATION_DELAY unless a registered device or the desk approves it: a phished
-- password alone never registers a phone. Set when a device row is written, never cleared.
-- Backfilled on the strict side: any device row (a pending one registers by itself), any
-- revocation and any removed device count as a registered device once.
ALTER TABLE accounts ADD COLUMN had_registered_device boolean NOT NULL DEFAULT false;
UPDATE accounts a SET had_registered_device = true
WHERE EXISTS (SELECT 1 FROM devices d WHERE d.account_id = a.id)
   OR EXISTS (SELECT 1 FROM device_revocations r WHERE r.account_id = a.id)
   OR EXISTS (SELECT 1 FROM removed_devices m WHERE m.account_id = a.id);
