-- 0004: retention pages in order.
--
-- The lifecycle pass pages through jobs due for retention by (due, job_id) after a cursor,
-- so that a job whose S3 objects could not be deleted stays behind the cursor until the
-- next pass. 0001's single-column indexes give the due order but not the job_id order
-- within a due time, and jobs finished by one statement share it: each page had to read
-- and sort every due row. These two give the exact order, so a page reads one batch.
-- Additive: nothing else changes, and nothing older relies on them.

CREATE INDEX jobs_retention_ttl_page ON jobs (retain_until, job_id)
    WHERE parent_id IS NULL AND retain_until IS NOT NULL;
CREATE INDEX jobs_retention_default_page ON jobs (finished_at, job_id)
    WHERE parent_id IS NULL AND ttl IS NULL AND finished_at IS NOT NULL;
