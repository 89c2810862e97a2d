-- 0016: a function's health, what its last run saw, and who started a run by hand.
--
-- consecutive_failures counts the failed runs since the last success (skipped and
-- interrupted runs leave it as it is): a function is unhealthy from the third. last_values
-- holds what the last successful run saw at that moment (pods listed, orphan suspects,
-- unverifiable claims...): values to read as they are, never to add up. Totals that a
-- release before this one summed from them are dropped (a sum of snapshots means nothing).
ALTER TABLE function_status
    ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN last_values jsonb NOT NULL DEFAULT '{}'::jsonb;

DELETE FROM function_totals
WHERE item IN ('pods_listed', 'unverifiable_claims', 'orphan_suspects', 'objects_scanned',
               'objects_unrecognized', 'longest_batch_seconds');

-- A run started by hand records who and why, when given (JOBFENCE_TRIGGERED_BY,
-- JOBFENCE_TRIGGER_REASON).
ALTER TABLE function_runs ADD COLUMN triggered_by text, ADD COLUMN trigger_reason text;
