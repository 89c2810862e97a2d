-- 0030: a job a schedule enqueues carries the trace context of the pass that enqueued it,
-- as every other enqueue's job does (0026): the schedules pass, where it traces, opens a
-- producer span for each batch of ticks and hands its traceparent with each tick.
-- scheduler_fire takes it (NULL: the pass does not trace) and is otherwise unchanged.

DROP FUNCTION {schema}.scheduler_fire(uuid[], timestamptz[], timestamptz[], timestamptz[],
                                      uuid[]);

CREATE FUNCTION {schema}.scheduler_fire(p_schedule_ids uuid[], p_expected timestamptz[],
                                       p_ticks timestamptz[], p_following timestamptz[],
                                       p_job_ids uuid[], p_traceparents text[])
RETURNS TABLE (schedule_id uuid, name text, tick_at timestamptz, job_id uuid, outcome text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF (SELECT k.draining FROM {schema}.jobfence_control k FOR SHARE) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH given AS (
        SELECT * FROM unnest(p_schedule_ids[1:1000], p_expected[1:1000], p_ticks[1:1000],
                             p_following[1:1000], p_job_ids[1:1000], p_traceparents[1:1000])
            AS g (schedule_id, expected, tick, following, job_id, traceparent)
    ), moved AS (
        UPDATE {schema}.schedules s SET
            next_tick_at = g.following, last_tick_at = g.tick, last_job_id = g.job_id
        FROM given g
        WHERE s.schedule_id = g.schedule_id AND s.next_tick_at = g.expected
          AND NOT s.paused AND g.tick >= g.expected AND g.following > g.tick
          AND g.tick <= clock_timestamp() AND g.job_id IS NOT NULL
        RETURNING s.schedule_id, s.name, s.job, g.tick, g.job_id, g.traceparent
    ), made AS (
        INSERT INTO {schema}.jobs AS n (
            job_id, status, actions, resource, priority, max_attempts, visible_at, labels,
            ttl, timeout, expires_at, idempotency_key, spec_hash, reason, queue, run_at,
            traceparent)
        SELECT m.job_id, 'pending', x.actions, x.resource, x.priority, x.max_attempts,
            coalesce(now() + make_interval(secs => x.delay_seconds), now()),
            coalesce(x.labels, '{{}}'::jsonb),
            make_interval(secs => x.ttl_seconds), make_interval(secs => x.timeout_seconds),
            now() + make_interval(secs => x.expires_in_seconds),
            'schedule:' || m.name || ':'
                || to_char(m.tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            x.spec_hash, 'schedule ' || m.name || ', tick '
                || to_char(m.tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            x.queue, now() + make_interval(secs => x.delay_seconds), m.traceparent
        FROM moved m
        CROSS JOIN LATERAL jsonb_to_record(m.job) AS x (
            actions jsonb, resource text, priority integer, max_attempts integer,
            labels jsonb, ttl_seconds float8, timeout_seconds float8,
            expires_in_seconds float8, spec_hash text, queue text, delay_seconds float8)
        -- Any unique index: the tick's idempotency key, or the resource held by an active
        -- job (then the tick is skipped, as a CronJob with concurrencyPolicy Forbid does).
        ON CONFLICT DO NOTHING
        RETURNING n.job_id
    ), recorded AS (
        INSERT INTO {schema}.schedule_ticks AS t (schedule_id, tick_at, job_id, outcome)
        SELECT m.schedule_id, m.tick,
               CASE WHEN d.job_id IS NOT NULL THEN m.job_id END,
               CASE WHEN d.job_id IS NOT NULL THEN 'enqueued'
                    WHEN EXISTS (SELECT FROM {schema}.jobs e WHERE e.idempotency_key =
                        'schedule:' || m.name || ':'
                        || to_char(m.tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
                    THEN 'exists'
                    ELSE 'resource_busy' END
        FROM moved m LEFT JOIN made d ON d.job_id = m.job_id
        ON CONFLICT ON CONSTRAINT schedule_ticks_pkey DO NOTHING
        RETURNING t.schedule_id, t.tick_at, t.job_id, t.outcome
    )
    SELECT r.schedule_id, m.name, r.tick_at, r.job_id, r.outcome
    FROM recorded r JOIN moved m ON m.schedule_id = r.schedule_id;
END;
$$;
