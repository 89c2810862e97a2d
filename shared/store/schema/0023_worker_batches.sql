-- 0023: reserved for the worker's batched writes (its own 0023_worker_batches.sql replaces
-- this file whole, by the same name). Until then it holds the number, so that 0024 follows
-- without a gap.
SELECT 1;
