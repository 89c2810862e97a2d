-- 0028: an action may ask to run again later without spending an attempt (a snooze), as
-- River's JobSnooze and Oban's {{:snooze, seconds}} do; a job cannot snooze forever unnoticed.
--
-- * jobs.snoozes counts the snoozes a job took. Like `interruptions` it is a count of
--   attempts given back without being spent; unlike them a snooze is the job's own choice,
--   so past the bound it fails the job outright (no attempt would do better).
-- * worker_snooze: the holder of the fence (and a live lease) gives its job back to
--   `pending`, visible again after the delay, the attempt not counted and the snooze counted;
--   or, when the job has snoozed p_max_snoozes times already, `failed` with why. The audit
--   trigger records the transition with its reason ("snoozed for ..."), which names the
--   delay and the action. The actions this attempt finished before stay recorded: the next
--   claim resumes after them.
-- * worker_claim's `interruptions` column now counts every claim given back without being
--   spent (SIGTERMs and snoozes): the worker reads it only to know whether an earlier claim
--   may have finished some actions (then it asks which). Same columns, same types.
--
-- Additive: an old worker never snoozes; it reads the claim's columns as before.

ALTER TABLE {schema}.jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0
    CONSTRAINT jobs_snoozes_counted CHECK (snoozes >= 0);

-- A job is born without snoozes, as without interruptions (0019's jobs_born_fresh).
DROP TRIGGER jobs_born_fresh ON {schema}.jobs;
CREATE TRIGGER jobs_born_fresh BEFORE INSERT ON {schema}.jobs FOR EACH ROW
    WHEN (NOT (NEW.status IN ('waiting', 'pending') OR (NEW.status = 'running' AND NEW.is_parent))
          OR NEW.attempt_id IS NOT NULL OR NEW.attempt_count <> 0 OR NEW.interruptions <> 0
          OR NEW.snoozes <> 0
          OR NEW.finished_at IS NOT NULL OR NEW.claimed_by IS NOT NULL
          OR NEW.claimed_at IS NOT NULL OR NEW.manifest IS NOT NULL
          OR NEW.stopping_attempt_id IS NOT NULL)
    EXECUTE FUNCTION {schema}.jobfence_refuse_forged_job();

CREATE FUNCTION {schema}.worker_snooze(p_job_id uuid, p_attempt_id uuid,
                                       p_delay_seconds float8, p_reason text,
                                       p_max_snoozes integer)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.jobfence_check_bounds('delay_seconds', p_delay_seconds, 0.001, 86400);
    PERFORM {schema}.jobfence_check_bounds('max_snoozes', p_max_snoozes, 0, 1000000);
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        status = CASE WHEN j.snoozes < p_max_snoozes THEN 'pending' ELSE 'failed' END,
        attempt_count = CASE WHEN j.snoozes < p_max_snoozes
                             THEN j.attempt_count - 1 ELSE j.attempt_count END,
        snoozes = CASE WHEN j.snoozes < p_max_snoozes THEN j.snoozes + 1 ELSE j.snoozes END,
        attempt_id = CASE WHEN j.snoozes < p_max_snoozes THEN NULL ELSE j.attempt_id END,
        visible_at = CASE WHEN j.snoozes < p_max_snoozes
                          THEN now() + make_interval(secs => p_delay_seconds)
                          ELSE now() END,
        finished_at = CASE WHEN j.snoozes >= p_max_snoozes THEN now() END,
        retain_until = CASE WHEN j.snoozes >= p_max_snoozes THEN now() + j.ttl END,
        claimed_by = NULL,
        run_deadline_at = NULL,
        reason = CASE WHEN j.snoozes < p_max_snoozes THEN p_reason
                      ELSE format('snoozed %s times, the most a job may (asked again: %s)',
                                  j.snoozes, p_reason) END,
        error = CASE WHEN j.snoozes < p_max_snoozes THEN j.error
                     ELSE format('snoozed %s times, the most a job may (asked again: %s)',
                                 j.snoozes, p_reason) END
    WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
      AND j.status = 'running' AND j.visible_at > clock_timestamp()
    RETURNING j.job_id, j.status, j.parent_id;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_claim(p_queue text, p_worker_id text,
                                                p_lease_seconds float8, p_limit integer)
RETURNS TABLE (job_id uuid, attempt_id uuid, attempt_count integer, max_attempts integer,
               actions jsonb, inputs jsonb, parent_id uuid, lease_expires_at timestamptz,
               run_deadline_at timestamptz, interruptions integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    settings record;
    room integer := p_limit;
BEGIN
    PERFORM {schema}.jobfence_check_bounds('lease_seconds', p_lease_seconds, 0.001, 86400);
    PERFORM {schema}.jobfence_check_bounds('limit', p_limit, 1, 1000);
    SELECT q.max_running, q.rate_limit, q.rate_period INTO settings
    FROM {schema}.queues q WHERE q.name = p_queue;
    IF settings.max_running IS NOT NULL OR settings.rate_limit IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(27238, hashtext(current_schema() || ':queue:' || p_queue));
        -- Read again under the lock: a rate set meanwhile counts from now on.
        SELECT q.max_running, q.rate_limit, q.rate_period INTO settings
        FROM {schema}.queues q WHERE q.name = p_queue;
    END IF;
    IF settings.rate_limit IS NOT NULL THEN
        DELETE FROM {schema}.queue_starts s
        WHERE s.queue = p_queue AND s.started_at < clock_timestamp() - settings.rate_period;
        room := least(room, greatest(0, settings.rate_limit - (
            SELECT count(*) FROM {schema}.queue_starts s WHERE s.queue = p_queue)::integer));
    END IF;
    IF settings.max_running IS NOT NULL THEN
        room := least(room, greatest(0, settings.max_running - (
            SELECT count(*) FROM {schema}.jobs r
            WHERE r.status = 'running' AND r.queue = p_queue AND NOT r.is_parent)::integer));
    END IF;
    IF room = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH candidate AS (
        SELECT c.job_id FROM {schema}.jobs c
        WHERE c.status = 'pending' AND c.queue = p_queue AND c.visible_at <= now()
          AND c.stopping_attempt_id IS NULL
          AND NOT (SELECT k.draining FROM {schema}.jobfence_control k)
          AND NOT coalesce((SELECT q.paused FROM {schema}.queues q WHERE q.name = p_queue),
                           false)
        ORDER BY c.priority DESC, c.visible_at
        LIMIT room
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE {schema}.jobs j SET
            status = 'running',
            attempt_id = gen_random_uuid(),
            attempt_count = j.attempt_count + 1,
            claimed_by = p_worker_id,
            claimed_at = CASE WHEN settings.rate_limit IS NULL THEN now()
                              ELSE clock_timestamp() END,
            heartbeat_at = now(),
            visible_at = now() + make_interval(secs => p_lease_seconds),
            run_deadline_at = now() + j.timeout,
            started_at = coalesce(j.started_at, now()),
            reason = 'claimed by ' || p_worker_id
        WHERE j.job_id = ANY(ARRAY(SELECT c.job_id FROM candidate c))
          AND j.attempt_count < j.max_attempts
        RETURNING j.job_id, j.attempt_id, j.attempt_count, j.max_attempts, j.actions,
            j.inputs, j.parent_id, j.visible_at, j.run_deadline_at,
            j.interruptions + j.snoozes AS given_back, j.claimed_at
    ), started AS (
        INSERT INTO {schema}.queue_starts (queue, started_at)
        SELECT p_queue, c.claimed_at FROM claimed c
        WHERE settings.rate_limit IS NOT NULL
    )
    SELECT c.job_id, c.attempt_id, c.attempt_count, c.max_attempts, c.actions, c.inputs,
        c.parent_id, c.visible_at, c.run_deadline_at, c.given_back FROM claimed c;
END;
$$;
