-- 0033: two rules that held for one verb and not for another.
--
-- * A queue's limit on running jobs counts an attempt still stopping. A cancel, a run
--   timeout or a reclaim of a pod whose node stopped answering rotates the fence while the
--   attempt's command may still run; the attempt kept its job's resource (0019) but gave up
--   its queue slot, so a second job of a limit-1 queue could run beside a command still
--   running — for up to a lease when its worker was frozen. worker_claim now counts it,
--   until its worker confirms the command gone (worker_stopped) or its lease runs out (a
--   worker that cannot renew its lease has killed its command by then: invariant 6).
-- * `expires_in` ("cancelled if not started by then") expires only jobs that never
--   started. lifecycle's expire_pending (maintenance.sql) cancelled any waiting or pending
--   job past its expires_at — a job snoozed, waiting for its retry, given back on SIGTERM
--   or reclaimed too, its attempts unused. It now passes over any job with a started_at;
--   the index it walks holds only jobs never started, so a started job past its expiry is
--   never read again by the pass.

DROP INDEX {schema}.jobs_pending_expiry;
CREATE INDEX jobs_pending_expiry ON {schema}.jobs (expires_at)
    WHERE status IN ('waiting', 'pending') AND expires_at IS NOT NULL AND started_at IS NULL;

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
        -- A slot is held by each running job, and by each attempt still stopping (its fence
        -- rotated by a cancel, a run timeout or a reclaim while its command may still run)
        -- until its worker confirms the command gone or its lease runs out.
        room := least(room, greatest(0, settings.max_running - (
            SELECT count(*) FROM {schema}.jobs r
            WHERE r.status = 'running' AND r.queue = p_queue AND NOT r.is_parent)::integer
            - (SELECT count(*) FROM {schema}.jobs s
               WHERE s.stopping_attempt_id IS NOT NULL AND s.queue = p_queue
                 AND s.stopping_until > clock_timestamp())::integer));
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
