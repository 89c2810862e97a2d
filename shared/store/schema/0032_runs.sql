-- 0032: a job's run — what an operator's `retry` starts afresh — and what a resumed run keeps.
--
-- * jobs.run counts the operator's retries of a job (0 for the run its enqueue began), and
--   every action result is stamped with the run it belongs to (job_action_results.run,
--   filled in by a trigger from the job's row, whoever writes the result: the fence those
--   writes check means the job's row is the attempt's). A retry is the only way from failed
--   or cancelled back to pending or waiting; the trigger of 0031 that reset the snoozes
--   there now also begins the next run (jobs_retry_starts_run).
-- * worker_done_actions answers the actions that succeeded in the job's current run only:
--   before, every success of every attempt ever counted, so that after a retry a job could
--   end `succeeded` although its first action failed in every attempt since the retry.
-- * What a resumed run made is kept. A claim that resumes (after a failed attempt, a snooze,
--   a SIGTERM give-back, a reclaim) skips the actions an earlier attempt of the run finished;
--   their outputs live under that attempt's prefix. Such an attempt — one that finished an
--   action of the job's current run — owns its outputs like the attempt holding the fence
--   does, for as long as its job may still use or list them (waiting, pending, running,
--   succeeded): orphan-cleanup's object_owners (pods.sql) keeps them, and a datum parent's
--   manifest (jobfence_children_page) lists them.
--
-- Additive: old workers call the same functions; a result they write is stamped by the
-- trigger. Results written before this migration are stamped from the audit trail: the
-- retries of their job recorded before them.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

ALTER TABLE {schema}.jobs ADD COLUMN run integer NOT NULL DEFAULT 0
    CONSTRAINT jobs_run_counted CHECK (run >= 0);
ALTER TABLE {schema}.job_action_results ADD COLUMN run integer NOT NULL DEFAULT 0;

UPDATE {schema}.jobs j SET run = r.n
FROM (SELECT e.job_id, count(*)::integer AS n FROM {schema}.job_events e
      WHERE e.from_status IN ('failed', 'cancelled') AND e.to_status IN ('pending', 'waiting')
      GROUP BY e.job_id) r
WHERE j.job_id = r.job_id;

UPDATE {schema}.job_action_results a SET run = (
    SELECT count(*)::integer FROM {schema}.job_events e
    WHERE e.job_id = a.job_id AND e.from_status IN ('failed', 'cancelled')
      AND e.to_status IN ('pending', 'waiting') AND e.at < a.finished_at)
WHERE a.job_id IN (SELECT j.job_id FROM {schema}.jobs j WHERE j.run > 0);

-- A retry begins the job's next run, with its snoozes afresh (0031's rule, kept here).
DROP TRIGGER IF EXISTS jobs_retry_resets_snoozes ON {schema}.jobs;
DROP FUNCTION IF EXISTS {schema}.jobfence_retry_snoozes();
