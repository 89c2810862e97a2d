-- 0024: a queue's rate — at most N of its jobs start in any window of a period (a second
-- to a day), across every pod, as pgqueuer's rate limit and Oban's do. The claim enforces
-- it in the database like the limit on running jobs: under the queue's transaction lock it
-- counts the starts recorded within the last period, claims at most what is left, and
-- records its own starts (a row per claimed job at its `claimed_at` — in a rate-limited
-- queue the clock of the claim itself rather than of its transaction's start, so that a
-- claim that waited for the lock is dated after the claims it waited for) before the lock
-- is let go, so no two claims ever count the same room. Rows older than the period are deleted by
-- the claim that finds them: the table holds at most N rows per rate-limited queue.

ALTER TABLE {schema}.queues
    ADD COLUMN rate_limit integer CONSTRAINT queues_rate_limit CHECK (rate_limit >= 0),
    ADD COLUMN rate_period interval CONSTRAINT queues_rate_period
        CHECK (rate_period BETWEEN interval '1 second' AND interval '1 day'),
    ADD CONSTRAINT queues_rate_whole CHECK ((rate_limit IS NULL) = (rate_period IS NULL));

CREATE TABLE {schema}.queue_starts (
    queue      text NOT NULL,
    started_at timestamptz NOT NULL
);
CREATE INDEX queue_starts_queue_at ON {schema}.queue_starts (queue, started_at);

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
            j.inputs, j.parent_id, j.visible_at, j.run_deadline_at, j.interruptions,
            j.claimed_at
    ), started AS (
        INSERT INTO {schema}.queue_starts (queue, started_at)
        SELECT p_queue, c.claimed_at FROM claimed c
        WHERE settings.rate_limit IS NOT NULL
    )
    SELECT c.job_id, c.attempt_id, c.attempt_count, c.max_attempts, c.actions, c.inputs,
        c.parent_id, c.visible_at, c.run_deadline_at, c.interruptions FROM claimed c;
END;
$$;

-- Set (or, with NULLs, remove) a queue's rate, recorded with who asked.
CREATE FUNCTION {schema}.operator_queue_rate(p_queue text, p_rate_limit integer,
                                            p_period_seconds float8, p_actor text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    name text;
    period interval := make_interval(secs => p_period_seconds);
BEGIN
    IF (p_rate_limit IS NULL) <> (p_period_seconds IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'a rate is a number of starts and a period, or none';
    END IF;
    IF p_rate_limit IS NOT NULL THEN
        PERFORM {schema}.jobfence_check_bounds('rate', p_rate_limit, 0, 1000000);
        PERFORM {schema}.jobfence_check_bounds('rate period', p_period_seconds, 1, 86400);
    END IF;
    INSERT INTO {schema}.queues AS q (name, rate_limit, rate_period, changed_at)
    VALUES (p_queue, p_rate_limit, period, now())
    ON CONFLICT ON CONSTRAINT queues_pkey DO UPDATE SET
        rate_limit = p_rate_limit, rate_period = period, changed_at = now()
    RETURNING q.name INTO name;
    IF p_rate_limit IS NULL THEN
        DELETE FROM {schema}.queue_starts s WHERE s.queue = p_queue;
    END IF;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, 'queue_rate', p_queue,
            jsonb_build_object('rate', p_rate_limit, 'period_seconds', p_period_seconds));
    RETURN name;
END;
$$;
