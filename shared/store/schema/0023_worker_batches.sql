-- 0023: the worker's batched writes, which arrive on their own branch. Until they do, this
-- file holds the number so that 0024 (traces) follows without a gap: when both meet, the
-- worker's 0023_worker_batches.sql replaces this file whole (same name, on purpose).
SELECT 1;
