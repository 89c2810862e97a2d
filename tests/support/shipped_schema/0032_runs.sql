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
DROP TRIGGER jobs_retry_resets_snoozes ON {schema}.jobs;
DROP FUNCTION {schema}.jobfence_retry_snoozes();

CREATE FUNCTION {schema}.jobfence_retry_starts_run() RETURNS trigger
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
BEGIN
    NEW.snoozes := 0;
    NEW.run := OLD.run + 1;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_retry_starts_run
    BEFORE UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (OLD.status IN ('failed', 'cancelled') AND NEW.status IN ('pending', 'waiting'))
    EXECUTE FUNCTION {schema}.jobfence_retry_starts_run();

-- Every action result belongs to its job's run at the time it is written.
CREATE FUNCTION {schema}.jobfence_result_run() RETURNS trigger
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
BEGIN
    NEW.run := coalesce((SELECT j.run FROM {schema}.jobs j WHERE j.job_id = NEW.job_id), 0);
    RETURN NEW;
END;
$$;

CREATE TRIGGER job_action_results_run
    BEFORE INSERT ON {schema}.job_action_results
    FOR EACH ROW
    EXECUTE FUNCTION {schema}.jobfence_result_run();

-- The actions the job's current run finished (for the attempt holding the fence).
CREATE OR REPLACE FUNCTION {schema}.worker_done_actions(p_job_id uuid, p_attempt_id uuid)
RETURNS SETOF integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT DISTINCT r.action_index
    FROM {schema}.jobs j JOIN {schema}.job_action_results r ON r.job_id = j.job_id
    WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id AND j.status = 'running'
      AND r.status = 'succeeded' AND r.run = j.run;
$$;

-- A parent's children with their committed outputs: for a child that succeeded, the
-- confirmed files of the attempt that won, and of every earlier attempt of its run that
-- finished an action (a resumed run skipped those actions; their files are its outputs).
CREATE OR REPLACE FUNCTION {schema}.jobfence_children_page(p_parent_id uuid, p_after uuid,
                                                           p_limit integer)
RETURNS TABLE (job_id uuid, status text, attempt_id uuid, inputs jsonb, error text,
               outputs text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT c.job_id, c.status, c.attempt_id, c.inputs, c.error,
        ARRAY(SELECT o.url FROM {schema}.job_outputs o
              WHERE c.status = 'succeeded' AND o.job_id = c.job_id AND o.status = 'done'
                AND (o.attempt_id = c.attempt_id
                     OR EXISTS (SELECT FROM {schema}.job_action_results r
                                WHERE r.job_id = c.job_id AND r.attempt_id = o.attempt_id
                                  AND r.status = 'succeeded' AND r.run = c.run))
              ORDER BY o.path, o.created_at)
    FROM {schema}.jobs c
    WHERE c.parent_id = p_parent_id AND c.job_id > p_after
    ORDER BY c.job_id
    LIMIT least(greatest(p_limit, 0), 10000);
$$;
