-- Companies as customers: an account's document is a CPF (11 digits) or a CNPJ (14 characters,
-- alphanumeric since July 2026), as pix.ParseDocument normalizes them.
ALTER TABLE accounts ALTER COLUMN document TYPE varchar(14);
