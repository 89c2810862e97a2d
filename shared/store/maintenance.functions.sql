-- Database functions taking claims away and releasing stopped attempts, for the periodic
-- passes (store/maintenance.py and store/pods.py run them through their .sql).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- A rotation of running jobs' fences by a periodic pass: back to pending with backoff, or
-- failed once attempts are exhausted. Where `stops` says so (a run timeout, a pod whose
-- node stopped answering: its worker may still be running the command), the attempt is
-- kept as stopping until its lease's end, and its worker is told at once.
CREATE OR REPLACE FUNCTION {schema}.jobfence_reclaim(
    ids uuid[], reasons text[], errors text[], base_seconds float8, cap_seconds float8,
    stops boolean[])
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    made record;
BEGIN
    FOR made IN
        UPDATE {schema}.jobs j SET
            status = CASE WHEN j.attempt_count >= j.max_attempts THEN 'failed'
                          ELSE 'pending' END,
            attempt_id = NULL,
            claimed_by = NULL,
            run_deadline_at = NULL,
            stopping_attempt_id = CASE WHEN r.stop AND j.visible_at > now()
                                       THEN j.attempt_id END,
            stopping_until = CASE WHEN r.stop AND j.visible_at > now()
                                  THEN j.visible_at END,
            visible_at = now()
                + {schema}.jobfence_retry_delay(j.attempt_count, base_seconds, cap_seconds),
            finished_at = CASE WHEN j.attempt_count >= j.max_attempts THEN now() END,
            retain_until = CASE WHEN j.attempt_count >= j.max_attempts
                                THEN now() + j.ttl END,
            reason = r.reason,
            error = r.error
        FROM unnest(ids, reasons, errors, stops) AS r (job_id, reason, error, stop)
        WHERE j.job_id = r.job_id AND j.status = 'running' AND NOT j.is_parent
        RETURNING j.job_id, j.status, j.parent_id, j.stopping_attempt_id
    LOOP
        IF made.stopping_attempt_id IS NOT NULL THEN
            PERFORM pg_notify(current_schema() || '.stop', made.job_id::text);
        END IF;
        job_id := made.job_id; status := made.status; parent_id := made.parent_id;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- The five-argument form of 0005, from before a reclaim could keep an attempt stopping:
-- kept for passes of releases before 0019 during a rolling deploy (the same rotation, no
-- stopping mark, no notification).
CREATE OR REPLACE FUNCTION {schema}.jobfence_reclaim(ids uuid[], reasons text[], errors text[],
                                                    base_seconds float8, cap_seconds float8)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SET search_path = {schema}, pg_temp AS $$
    UPDATE {schema}.jobs j SET
        status = CASE WHEN j.attempt_count >= j.max_attempts THEN 'failed' ELSE 'pending' END,
        attempt_id = NULL,
        claimed_by = NULL,
        run_deadline_at = NULL,
        visible_at = now()
            + {schema}.jobfence_retry_delay(j.attempt_count, base_seconds, cap_seconds),
        finished_at = CASE WHEN j.attempt_count >= j.max_attempts THEN now() END,
        retain_until = CASE WHEN j.attempt_count >= j.max_attempts THEN now() + j.ttl END,
        reason = r.reason,
        error = r.error
    FROM unnest(ids, reasons, errors) AS r (job_id, reason, error)
    WHERE j.job_id = r.job_id AND j.status = 'running' AND NOT j.is_parent
    RETURNING j.job_id, j.status, j.parent_id
$$;

-- The maintainer's look for stopping attempts whose lease has run out: their worker never
-- confirmed (it died, or was cut off), and the lease bounds how long it may have run.
CREATE OR REPLACE FUNCTION {schema}.jobfence_release_stopped(p_limit integer)
RETURNS SETOF uuid
LANGUAGE sql SET search_path = {schema}, pg_temp AS $$
    UPDATE {schema}.jobs j SET stopping_attempt_id = NULL, stopping_until = NULL
    WHERE j.job_id = ANY(ARRAY(
        SELECT s.job_id FROM {schema}.jobs s
        WHERE s.stopping_attempt_id IS NOT NULL AND s.stopping_until <= clock_timestamp()
        ORDER BY s.stopping_until LIMIT p_limit FOR UPDATE SKIP LOCKED))
      AND j.stopping_until <= clock_timestamp()
    RETURNING j.job_id;
$$;
