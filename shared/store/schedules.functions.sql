-- Database functions of schedules: the operator's verbs and the pass's exactly-once fire
-- (store/schedules.py runs them through schedules.sql; migration 0021 says how a tick is
-- enqueued once).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- Why a schedule's stored spec and job would not enqueue (NULL when they would): the
-- checks an enqueue makes, made once when the schedule is added, never at each tick.
CREATE OR REPLACE FUNCTION {schema}.jobfence_schedule_refusal(
    p_name text, p_spec jsonb, p_job jsonb)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = {schema}, pg_temp AS $$
DECLARE
    spec_keys constant text[] := ARRAY['actions', 'resource', 'max_attempts', 'priority',
        'after', 'idempotency_key', 'ttl', 'timeout', 'inactivity_timeout', 'expires_in',
        'inputs', 'labels', 'queue', 'run_at', 'delay', 'group'];
    job_keys constant text[] := ARRAY['actions', 'resource', 'priority', 'max_attempts',
        'labels', 'ttl_seconds', 'timeout_seconds', 'expires_in_seconds', 'spec_hash',
        'queue', 'delay_seconds'];
    refused constant text[] := ARRAY['after', 'inputs', 'idempotency_key', 'run_at'];
    k text;
    a jsonb;
    s jsonb;
    i integer;
    n integer;
    secs numeric;
BEGIN
    IF jsonb_typeof(p_spec) IS DISTINCT FROM 'object' THEN
        RETURN 'spec: not a JSON object';
    END IF;
    IF jsonb_typeof(p_job) IS DISTINCT FROM 'object' THEN
        RETURN 'job: not a JSON object';
    END IF;
    FOR k IN SELECT jsonb_object_keys(p_spec) LOOP
        IF NOT k = ANY (spec_keys) THEN
            RETURN format('spec: unknown field %s', left(k, 60));
        END IF;
        IF k = ANY (refused) AND p_spec -> k NOT IN ('null', '[]', '{{}}') THEN
            RETURN format('spec: %s: a schedule''s job cannot have it', k);
        END IF;
    END LOOP;
    IF (SELECT array_agg(x ORDER BY x) FROM jsonb_object_keys(p_job) x WHERE x <> 'group_key')
       IS DISTINCT FROM (SELECT array_agg(x ORDER BY x) FROM unnest(job_keys) x) THEN
        RETURN 'job: not the template jobfence makes from a spec (its fields differ)';
    END IF;

    -- The actions: 1 to 1,000, each the spec's own.
    IF jsonb_typeof(p_job -> 'actions') IS DISTINCT FROM 'array'
       OR jsonb_typeof(p_spec -> 'actions') IS DISTINCT FROM 'array' THEN
        RETURN 'actions: not a list';
    END IF;
    n := jsonb_array_length(p_job -> 'actions');
    IF n NOT BETWEEN 1 AND 1000 OR n <> jsonb_array_length(p_spec -> 'actions') THEN
        RETURN 'actions: the job runs other actions than the spec shows';
    END IF;
    FOR i IN 0 .. n - 1 LOOP
        a := p_job -> 'actions' -> i;
        s := p_spec -> 'actions' -> i;
        IF jsonb_typeof(a) IS DISTINCT FROM 'object' OR jsonb_typeof(s) IS DISTINCT FROM 'object'
           OR EXISTS (SELECT FROM jsonb_object_keys(a) x
                      WHERE x NOT IN ('name', 'params', 'inactivity_timeout'))
           OR EXISTS (SELECT FROM jsonb_object_keys(s) x
                      WHERE x NOT IN ('name', 'params', 'inactivity_timeout'))
           OR jsonb_typeof(a -> 'name') IS DISTINCT FROM 'string'
           OR length(a ->> 'name') NOT BETWEEN 1 AND 200
           OR jsonb_typeof(a -> 'params') IS DISTINCT FROM 'object'
           OR a -> 'name' IS DISTINCT FROM s -> 'name'
           OR a -> 'params' IS DISTINCT FROM coalesce(s -> 'params', '{{}}'::jsonb)
           OR a -> 'inactivity_timeout' IS DISTINCT FROM
              coalesce(s -> 'inactivity_timeout', p_spec -> 'inactivity_timeout')
           OR jsonb_typeof(coalesce(a -> 'inactivity_timeout', '""')) <> 'string' THEN
            RETURN format('actions[%s]: the job runs another action than the spec shows', i);
        END IF;
    END LOOP;

    -- The job's own fields: of the spec's values, within the CLI's bounds.
    IF p_job -> 'resource' IS DISTINCT FROM coalesce(p_spec -> 'resource', 'null')
       OR (jsonb_typeof(p_job -> 'resource') = 'string'
           AND length(p_job ->> 'resource') NOT BETWEEN 1 AND 500)
       OR jsonb_typeof(p_job -> 'resource') NOT IN ('string', 'null') THEN
        RETURN 'resource: not the spec''s, or not 1 to 500 characters';
    END IF;
    IF jsonb_typeof(p_job -> 'priority') IS DISTINCT FROM 'number'
       OR (p_job ->> 'priority')::numeric <> trunc((p_job ->> 'priority')::numeric)
       OR (p_job ->> 'priority')::numeric NOT BETWEEN -1000000 AND 1000000
       OR p_job -> 'priority' <> coalesce(p_spec -> 'priority', '0') THEN
        RETURN 'priority: not the spec''s, or not a whole number within 1,000,000';
    END IF;
    IF jsonb_typeof(p_job -> 'max_attempts') IS DISTINCT FROM 'number'
       OR (p_job ->> 'max_attempts')::numeric <> trunc((p_job ->> 'max_attempts')::numeric)
       OR (p_job ->> 'max_attempts')::numeric NOT BETWEEN 1 AND 1000
       OR p_job -> 'max_attempts' <> coalesce(p_spec -> 'max_attempts', p_job -> 'max_attempts')
    THEN
        RETURN 'max_attempts: not the spec''s, or not from 1 to 1000';
    END IF;
    IF jsonb_typeof(p_job -> 'queue') IS DISTINCT FROM 'string'
       OR p_job ->> 'queue' !~ '^[a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?$'
       OR p_job -> 'queue' <> coalesce(p_spec -> 'queue', '"default"') THEN
        RETURN 'queue: not the spec''s, or not a queue name';
    END IF;
    IF coalesce(p_job -> 'group_key', 'null') IS DISTINCT FROM coalesce(p_spec -> 'group', 'null')
       OR (p_job ? 'group_key' AND (jsonb_typeof(p_job -> 'group_key') <> 'string'
           OR p_job ->> 'group_key' !~ '^[A-Za-z0-9]([-A-Za-z0-9_.:@/]{{0,126}}[A-Za-z0-9])?$'))
    THEN
        RETURN 'group: not the spec''s, or not a group';
    END IF;
    IF jsonb_typeof(p_job -> 'labels') IS DISTINCT FROM 'object'
       OR p_job -> 'labels' <> coalesce(p_spec -> 'labels', '{{}}')
                               || jsonb_build_object('jobfence.io/schedule', p_name)
       OR (SELECT count(*) FROM jsonb_object_keys(p_job -> 'labels')) > 64
       OR EXISTS (SELECT FROM jsonb_each(p_job -> 'labels') e
                  WHERE length(e.key) NOT BETWEEN 1 AND 253
                     OR jsonb_typeof(e.value) <> 'string' OR length(e.value #>> '{{}}') > 1000)
    THEN
        RETURN 'labels: not the spec''s with the schedule''s own, or not text within bounds';
    END IF;
    FOR k IN SELECT unnest(ARRAY['ttl', 'timeout', 'expires_in', 'delay']) LOOP
        IF coalesce(p_job -> (k || '_seconds'), 'null') = 'null' THEN
            IF coalesce(p_spec -> k, 'null') <> 'null' THEN
                RETURN format('%s: the spec has one and the job none', k);
            END IF;
            CONTINUE;
        END IF;
        IF jsonb_typeof(p_job -> (k || '_seconds')) <> 'number'
           OR jsonb_typeof(p_spec -> k) IS DISTINCT FROM 'string' THEN
            RETURN format('%s: not a duration', k);
        END IF;
        secs := (p_job ->> (k || '_seconds'))::numeric;
        IF secs <= 0 OR secs > 3153600000  -- 100 years (jobfence.limits.MAX_DURATION)
           OR abs(extract(epoch FROM (p_spec ->> k)::interval) - secs) > 0.000001 THEN
            RETURN format('%s: not the spec''s duration, or not within 100 years', k);
        END IF;
    END LOOP;
    IF (p_job ->> 'expires_in_seconds')::numeric <= (p_job ->> 'delay_seconds')::numeric THEN
        RETURN 'expires_in: not longer than its delay: the job would expire before it starts';
    END IF;
    IF jsonb_typeof(p_job -> 'spec_hash') IS DISTINCT FROM 'string'
       OR p_job ->> 'spec_hash' !~ '^[0-9a-f]{{64}}$' THEN
        RETURN 'spec_hash: not a SHA-256 in hex';
    END IF;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN  -- a value no check above foresaw: refused, never raised
    RETURN 'unreadable: ' || SQLERRM;
END;
$$;

-- Add a schedule (an operator's `schedule add`), refused with the reason
-- jobfence_schedule_refusal gives; recorded in control_events.
CREATE OR REPLACE FUNCTION {schema}.operator_schedule_add(p_name text, p_cron text,
                                                         p_timezone text, p_spec jsonb,
                                                         p_job jsonb,
                                                         p_next_tick_at timestamptz,
                                                         p_actor text)
RETURNS SETOF {schema}.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    why text := {schema}.jobfence_schedule_refusal(p_name, p_spec, p_job);
BEGIN
    IF why IS NULL AND (array_length(string_to_array(p_cron, ' '), 1) IS DISTINCT FROM 5
       OR p_cron !~ '^[0-9A-Za-z*/,#?LW-]{{1,100}}( [0-9A-Za-z*/,#?LW-]{{1,100}}){{4}}$') THEN
        why := 'cron: not five fields (minute hour day-of-month month day-of-week)';
    END IF;
    IF why IS NULL AND (p_timezone !~ '^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+){{0,3}}$'
       OR NOT EXISTS (SELECT FROM pg_catalog.pg_timezone_names z WHERE z.name = p_timezone))
    THEN
        why := 'timezone: no such time zone';
    END IF;
    IF why IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation',
            CONSTRAINT = 'schedules_as_the_cli_stores',
            MESSAGE = format('schedule %s: %s', left(p_name, 63), why);
    END IF;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, 'schedule_add', p_name,
            jsonb_build_object('cron', p_cron, 'timezone', p_timezone));
    RETURN QUERY
    INSERT INTO {schema}.schedules AS s (name, cron, timezone, spec, job, next_tick_at,
                                         created_by, changed_by)
    VALUES (p_name, p_cron, p_timezone, p_spec, p_job, p_next_tick_at, p_actor, p_actor)
    RETURNING s.*;
END;
$$;

-- Pause or resume a schedule, recorded. A resume starts from the tick after now (given by
-- the caller, who evaluates the cron expression): ticks that fell while it was paused are
-- not caught up.
CREATE OR REPLACE FUNCTION {schema}.operator_schedule_pause(
    p_name text, p_paused boolean, p_next_tick_at timestamptz, p_actor text)
RETURNS SETOF {schema}.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    changed {schema}.schedules;
BEGIN
    UPDATE {schema}.schedules s SET
        paused = p_paused,
        next_tick_at = CASE WHEN NOT p_paused AND s.paused
                            THEN coalesce(p_next_tick_at, s.next_tick_at)
                            ELSE s.next_tick_at END,
        changed_at = now(), changed_by = p_actor
    WHERE s.name = p_name
    RETURNING s.* INTO changed;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JF404', DETAIL = p_name,
            MESSAGE = format('no schedule named %s', p_name);
    END IF;
    INSERT INTO {schema}.control_events (actor, action, subject)
    VALUES (p_actor, CASE WHEN p_paused THEN 'schedule_pause' ELSE 'schedule_resume' END,
            p_name);
    RETURN NEXT changed;
END;
$$;

-- Delete a schedule and its record of ticks (the jobs it enqueued stay), recorded.
CREATE OR REPLACE FUNCTION {schema}.operator_schedule_delete(p_name text, p_actor text)
RETURNS SETOF {schema}.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    gone {schema}.schedules;
BEGIN
    DELETE FROM {schema}.schedules s WHERE s.name = p_name RETURNING s.* INTO gone;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JF404', DETAIL = p_name,
            MESSAGE = format('no schedule named %s', p_name);
    END IF;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, 'schedule_delete', p_name,
            jsonb_build_object('cron', gone.cron, 'timezone', gone.timezone));
    RETURN NEXT gone;
END;
$$;

-- The schedules pass's batch: each schedule still at the tick the pass read moves to its
-- following tick, and the tick's job is inserted, exactly once however many passes race.
CREATE OR REPLACE FUNCTION {schema}.scheduler_fire(p_schedule_ids uuid[],
                                                  p_expected timestamptz[],
                                                  p_ticks timestamptz[],
                                                  p_following timestamptz[],
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
        SELECT g.*, {schema}.jobfence_schedule_refusal(s.name, s.spec, s.job) AS refusal
        FROM unnest(p_schedule_ids[1:1000], p_expected[1:1000], p_ticks[1:1000],
                    p_following[1:1000], p_job_ids[1:1000], p_traceparents[1:1000])
            AS g (schedule_id, expected, tick, following, job_id, traceparent)
        JOIN {schema}.schedules s ON s.schedule_id = g.schedule_id
    ), due AS (
        UPDATE {schema}.schedules s SET
            next_tick_at = g.following, last_tick_at = g.tick,
            last_job_id = CASE WHEN g.refusal IS NULL THEN g.job_id ELSE s.last_job_id END
        FROM given g
        WHERE s.schedule_id = g.schedule_id AND s.next_tick_at = g.expected
          AND NOT s.paused AND g.tick >= g.expected AND g.following > g.tick
          AND g.tick <= clock_timestamp() AND g.job_id IS NOT NULL
        RETURNING s.schedule_id, s.name, s.job, g.tick, g.job_id, g.traceparent, g.refusal
    ), moved AS (
        SELECT * FROM due d WHERE d.refusal IS NULL
    ), made AS (
        INSERT INTO {schema}.jobs AS n (
            job_id, status, actions, resource, priority, max_attempts, visible_at, labels,
            ttl, timeout, expires_at, idempotency_key, spec_hash, reason, queue, run_at,
            traceparent, group_key)
        SELECT m.job_id, 'pending', x.actions, x.resource, x.priority, x.max_attempts,
            coalesce(now() + make_interval(secs => x.delay_seconds), now()),
            coalesce(x.labels, '{{}}'::jsonb),
            make_interval(secs => x.ttl_seconds), make_interval(secs => x.timeout_seconds),
            now() + make_interval(secs => x.expires_in_seconds),
            'schedule:' || m.name || ':'
                || to_char(m.tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            x.spec_hash, 'schedule ' || m.name || ', tick '
                || to_char(m.tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            x.queue, now() + make_interval(secs => x.delay_seconds), m.traceparent,
            x.group_key
        FROM moved m
        CROSS JOIN LATERAL jsonb_to_record(m.job) AS x (
            actions jsonb, resource text, priority integer, max_attempts integer,
            labels jsonb, ttl_seconds float8, timeout_seconds float8,
            expires_in_seconds float8, spec_hash text, queue text, delay_seconds float8,
            group_key text)
        -- Any unique index: the tick's idempotency key, or the resource held by an active
        -- job (then the tick is skipped, as a CronJob with concurrencyPolicy Forbid does).
        ON CONFLICT DO NOTHING
        RETURNING n.job_id
    ), recorded AS (
        INSERT INTO {schema}.schedule_ticks AS t (schedule_id, tick_at, job_id, outcome)
        SELECT m.schedule_id, m.tick,
               CASE WHEN d.job_id IS NOT NULL THEN m.job_id END,
               CASE WHEN m.refusal IS NOT NULL THEN 'invalid'
                    WHEN d.job_id IS NOT NULL THEN 'enqueued'
                    WHEN EXISTS (SELECT FROM {schema}.jobs e WHERE e.idempotency_key =
                        'schedule:' || m.name || ':'
                        || to_char(m.tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
                    THEN 'exists'
                    ELSE 'resource_busy' END
        FROM due m LEFT JOIN made d ON d.job_id = m.job_id
        ON CONFLICT ON CONSTRAINT schedule_ticks_pkey DO NOTHING
        RETURNING t.schedule_id, t.tick_at, t.job_id, t.outcome
    )
    SELECT r.schedule_id, m.name, r.tick_at, r.job_id, r.outcome
    FROM recorded r JOIN due m ON m.schedule_id = r.schedule_id;
END;
$$;
