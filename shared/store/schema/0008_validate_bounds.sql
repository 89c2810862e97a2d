-- 0008: validate 0007's bounds on existing rows (SHARE UPDATE EXCLUSIVE: writes go on).
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_ttl_bounded;
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_timeout_bounded;
