-- 0034: a retried job waits for its dependencies as an enqueue makes it wait; a snoozed
-- claim's output is kept; each claim's audit event keeps the attempt number it ran as.
--
-- operator_retry and operator_retry_many made a failed or cancelled job `pending` at once,
-- whatever its `after` dependencies: it ran while a dependency was still running, or after
-- one had failed. A retried job that has dependencies is now `waiting`, and the retry then
-- settles it as an enqueue does (resolve_waiting, read after its commit, so that a
-- dependency finishing meanwhile is seen by one side or the other:
-- jobfence.store.dependencies): pending once they all succeeded, failed — naming the
-- dependency — when one failed, was cancelled or is gone. A bulk retry settles the jobs it
-- made waiting once its whole selection is walked, so that a dependency retried in a later
-- batch than its dependent is waited for; export-finalize's safety net settles what an
-- interrupted retry left waiting. Otherwise the same rules and refusals (0019, 0021).
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

-- A snoozed claim's output ------------------------------------------------------------
-- The action that asks to run again later ends its claim like a failure ends one, yet what
-- it said — a command's exit code and output tails, or that its whole output went to S3 —
-- was stored nowhere: `status` showed nothing of that claim and `logs` could not find its
-- output. worker_snooze now takes the snoozing action's outcome too and records it under
-- the fence, as `snoozed` (neither done nor failed: the next claim runs that action again).
-- The one-row snooze of 0028 stays for a worker of the release before.

ALTER TABLE {schema}.job_action_results DROP CONSTRAINT job_action_results_status_check;
ALTER TABLE {schema}.job_action_results ADD CONSTRAINT job_action_results_status_check
    CHECK (status IN ('succeeded', 'failed', 'snoozed'));

-- Each claim's attempt number, in its audit event ------------------------------------
-- `status` shows `attempt N/M` (the attempt count) and the worker's output lines carry that
-- N, but `logs` numbered a job's claims one by one from its audit trail: a claim given back
-- by a snooze or a SIGTERM spends no attempt and the next claim runs as the same attempt,
-- and a retry starts counting afresh, so `logs --attempt 2` could be what `status` called
-- attempt 1. The claim's event now keeps the attempt count it ran as (job_events.attempt,
-- filled in by a trigger from the job's row, whoever wrote the event), and every surface
-- numbers a claim by it. Events written before this migration have none (NULL).

ALTER TABLE {schema}.job_events ADD COLUMN attempt integer;
