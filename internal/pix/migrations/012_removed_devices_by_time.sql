-- Removals are read, and deleted once they refuse no live token, by their time
-- (pix.WithTokenLifetime): an index, so that neither reads the whole log.
CREATE INDEX removed_devices_removed_at ON removed_devices (removed_at);
