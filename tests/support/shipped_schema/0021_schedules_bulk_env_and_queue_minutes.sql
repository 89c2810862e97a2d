-- 0021: what operators need from the second day on — schedules of users' own work, retry
-- and cancel of a selection, an audited look at a command's environment, and the minutes
-- behind the queue page's chart.
--
-- * Schedules. A schedule is a cron expression in a time zone and the job it enqueues,
--   validated when it is added (jobfence.schedules); `next_tick_at` is the next tick not
--   yet enqueued. The `schedules` pass (the maintainer role) computes the due tick and the
--   one after it, and scheduler_fire enqueues exactly what the schedule's stored job says,
--   once per tick: the schedule's row is moved on only from the tick the pass read (a
--   compare-and-set), the job's idempotency key names the schedule and the tick, and
--   schedule_ticks keeps one row per (schedule, tick). A tick whose job's resource is held
--   is recorded as skipped, never queued behind it. The maintainer never enqueues a job of
--   its own making: only what an operator scheduled, at a tick already due.
-- * Bulk retry and cancel. operator_retry_many and operator_cancel_many do what
--   operator_retry and operator_cancel do, for at most 1,000 jobs in one statement (the
--   caller pages through a selection, a transaction per batch), with the same refusals,
--   answered per job instead of raised.
-- * A command's env values are masked wherever a job is shown; operator_reveal_env hands
--   them to an operator who asks, and records who asked and why (control_events).
-- * job_metric_history: what each fold added, by the minute its transitions committed,
--   kept a day (the fold prunes it): the queue page's chart of jobs finished and run-time
--   percentiles reads it.

-- Schedules ------------------------------------------------------------------------------

CREATE TABLE {schema}.schedules (
    schedule_id  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name         text NOT NULL UNIQUE
                 CHECK (name ~ '^[a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?$'),
    cron         text NOT NULL CHECK (length(cron) <= 200),
    timezone     text NOT NULL CHECK (length(timezone) <= 100),
    spec         jsonb NOT NULL,
    job          jsonb NOT NULL,
    paused       boolean NOT NULL DEFAULT false,
    next_tick_at timestamptz NOT NULL,
    last_tick_at timestamptz,
    last_job_id  uuid,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text,
    changed_at   timestamptz NOT NULL DEFAULT now(),
    changed_by   text
);
-- The pass's look for due schedules, oldest tick first.
CREATE INDEX schedules_due ON {schema}.schedules (next_tick_at, schedule_id) WHERE NOT paused;

CREATE TABLE {schema}.schedule_ticks (
    schedule_id uuid NOT NULL REFERENCES {schema}.schedules ON DELETE CASCADE,
    tick_at     timestamptz NOT NULL,
    job_id      uuid,
    -- enqueued | resource_busy | exists (a job with the tick's key was already there)
    outcome     text NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (schedule_id, tick_at)
);
CREATE INDEX schedule_ticks_at ON {schema}.schedule_ticks (at);

-- Add a schedule (refused, 23505 on schedules_name_key, when the name is taken), recorded.
CREATE FUNCTION {schema}.operator_schedule_add(p_name text, p_cron text, p_timezone text,
                                              p_spec jsonb, p_job jsonb,
                                              p_next_tick_at timestamptz, p_actor text)
RETURNS SETOF {schema}.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
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
CREATE FUNCTION {schema}.operator_schedule_pause(p_name text, p_paused boolean,
                                                p_next_tick_at timestamptz, p_actor text)
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
CREATE FUNCTION {schema}.operator_schedule_delete(p_name text, p_actor text)
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

-- Enqueue the due ticks of a batch of schedules, each exactly once. For each schedule the
-- caller names the tick it read as next (p_expected), the tick to enqueue (the latest due
-- one: at most one is caught up after an outage) and the tick after it; a schedule that
-- another run moved on, that was paused or deleted meanwhile, or whose ticks are not in
-- order or not yet due by this database's clock, is left as it is and not answered. The
-- job is the one the schedule stores (what the operator added), pending now (or after its
-- delay), its idempotency key the schedule's name and the tick. Nothing while draining.
CREATE FUNCTION {schema}.scheduler_fire(p_schedule_ids uuid[], p_expected timestamptz[],
                                       p_ticks timestamptz[], p_following timestamptz[],
                                       p_job_ids uuid[])
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
                             p_following[1:1000], p_job_ids[1:1000])
            AS g (schedule_id, expected, tick, following, job_id)
    ), moved AS (
        UPDATE {schema}.schedules s SET
            next_tick_at = g.following, last_tick_at = g.tick, last_job_id = g.job_id
        FROM given g
        WHERE s.schedule_id = g.schedule_id AND s.next_tick_at = g.expected
          AND NOT s.paused AND g.tick >= g.expected AND g.following > g.tick
          AND g.tick <= clock_timestamp() AND g.job_id IS NOT NULL
        RETURNING s.schedule_id, s.name, s.job, g.tick, g.job_id
    ), made AS (
        INSERT INTO {schema}.jobs AS n (
            job_id, status, actions, resource, priority, max_attempts, visible_at, labels,
            ttl, timeout, expires_at, idempotency_key, spec_hash, reason, queue, run_at)
        SELECT m.job_id, 'pending', x.actions, x.resource, x.priority, x.max_attempts,
            coalesce(now() + make_interval(secs => x.delay_seconds), now()),
            coalesce(x.labels, '{{}}'::jsonb),
            make_interval(secs => x.ttl_seconds), make_interval(secs => x.timeout_seconds),
            now() + make_interval(secs => x.expires_in_seconds),
            'schedule:' || m.name || ':'
                || to_char(m.tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            x.spec_hash, 'schedule ' || m.name || ', tick '
                || to_char(m.tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            x.queue, now() + make_interval(secs => x.delay_seconds)
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

-- Bulk retry and cancel ------------------------------------------------------------------

-- operator_retry for each of at most 1,000 jobs: the same rules, a refusal per job instead
-- of an exception (not_found, not_failed_or_cancelled, parent, stopping,
-- parent_not_running, resource_busy). Rows are locked in id order. A job holding a
-- resource is retried on its own (a subtransaction) so that a busy resource refuses that
-- job alone; the others go in one statement.
CREATE FUNCTION {schema}.operator_retry_many(p_job_ids uuid[], p_reason text)
RETURNS TABLE (job_id uuid, status text, refusal text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    ids uuid[] := ARRAY(SELECT DISTINCT u FROM unnest(p_job_ids[1:1000]) u WHERE u IS NOT NULL);
    plain uuid[] := '{{}}';
    held uuid[] := '{{}}';
    one uuid;
    v record;
BEGIN
    IF (SELECT k.draining FROM {schema}.jobfence_control k FOR SHARE) THEN
        RAISE EXCEPTION USING ERRCODE = 'JF503',
            MESSAGE = 'drain mode is on: retry is refused until `drain off`';
    END IF;
    FOR v IN
        WITH locked AS (
            SELECT j.job_id, j.status, j.is_parent, j.parent_id, j.resource,
                   j.stopping_attempt_id, j.stopping_until
            FROM {schema}.jobs j WHERE j.job_id = ANY(ids) ORDER BY j.job_id FOR UPDATE
        )
        SELECT i.id, l.status, l.resource, CASE
            WHEN l.job_id IS NULL THEN 'not_found'
            WHEN l.is_parent THEN 'parent'
            WHEN l.status NOT IN ('failed', 'cancelled') THEN 'not_failed_or_cancelled'
            WHEN l.stopping_attempt_id IS NOT NULL AND l.stopping_until > clock_timestamp()
                THEN 'stopping'
            WHEN l.parent_id IS NOT NULL AND (SELECT p.status FROM {schema}.jobs p
                                              WHERE p.job_id = l.parent_id)
                                             IS DISTINCT FROM 'running'
                THEN 'parent_not_running'
        END AS refusal
        FROM unnest(ids) AS i (id) LEFT JOIN locked l ON l.job_id = i.id
    LOOP
        IF v.refusal IS NOT NULL THEN
            job_id := v.id; status := v.status; refusal := v.refusal;
            RETURN NEXT;
        ELSIF v.resource IS NULL THEN
            plain := plain || v.id;
        ELSE
            held := held || v.id;
        END IF;
    END LOOP;
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        status = 'pending', attempt_count = 0, interruptions = 0, attempt_id = NULL,
        claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, run_deadline_at = NULL,
        stopping_attempt_id = NULL, stopping_until = NULL,
        visible_at = now(), expires_at = NULL, finished_at = NULL, retain_until = NULL,
        error = NULL, error_detail = NULL, reason = p_reason
    WHERE j.job_id = ANY(plain)
    RETURNING j.job_id, j.status, NULL::text;
    FOREACH one IN ARRAY held LOOP
        BEGIN
            RETURN QUERY
            UPDATE {schema}.jobs j SET
                status = 'pending', attempt_count = 0, interruptions = 0, attempt_id = NULL,
                claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL,
                run_deadline_at = NULL, stopping_attempt_id = NULL, stopping_until = NULL,
                visible_at = now(), expires_at = NULL, finished_at = NULL,
                retain_until = NULL, error = NULL, error_detail = NULL, reason = p_reason
            WHERE j.job_id = one
            RETURNING j.job_id, j.status, NULL::text;
        EXCEPTION WHEN unique_violation THEN
            job_id := one; status := NULL; refusal := 'resource_busy';
            RETURN NEXT;
        END;
    END LOOP;
END;
$$;

-- operator_cancel for each of at most 1,000 jobs: a parent's unfinished children first,
-- then the jobs; a running attempt kept as stopping and its worker told. A job already
-- finished (or cancelled with its parent just now) answers `finished`; one not there,
-- `not_found`.
CREATE FUNCTION {schema}.operator_cancel_many(p_job_ids uuid[], p_reason text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid, refusal text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    ids uuid[] := ARRAY(SELECT DISTINCT u FROM unnest(p_job_ids[1:1000]) u WHERE u IS NOT NULL);
    touched uuid[] := '{{}}';
    made record;
BEGIN
    PERFORM 1 FROM {schema}.jobs j WHERE j.job_id = ANY(ids) ORDER BY j.job_id FOR UPDATE;
    FOR made IN
        UPDATE {schema}.jobs c SET
            status = 'cancelled',
            stopping_attempt_id = CASE WHEN c.status = 'running'
                                        AND c.visible_at > clock_timestamp()
                                       THEN c.attempt_id END,
            stopping_until = CASE WHEN c.status = 'running'
                                   AND c.visible_at > clock_timestamp()
                                  THEN c.visible_at END,
            attempt_id = NULL, claimed_by = NULL, run_deadline_at = NULL,
            finished_at = now(), retain_until = now() + c.ttl,
            reason = p_reason, error = p_reason
        WHERE c.parent_id = ANY(ids) AND c.status IN ('waiting', 'pending', 'running')
        RETURNING c.job_id, c.status, c.parent_id, c.stopping_attempt_id
    LOOP
        IF made.stopping_attempt_id IS NOT NULL THEN
            PERFORM pg_notify(current_schema() || '.stop', made.job_id::text);
        END IF;
        touched := touched || made.job_id;
        job_id := made.job_id; status := made.status; parent_id := made.parent_id;
        refusal := NULL;
        RETURN NEXT;
    END LOOP;
    FOR made IN
        UPDATE {schema}.jobs j SET
            status = 'cancelled',
            stopping_attempt_id = CASE WHEN j.status = 'running' AND NOT j.is_parent
                                        AND j.visible_at > clock_timestamp()
                                       THEN j.attempt_id END,
            stopping_until = CASE WHEN j.status = 'running' AND NOT j.is_parent
                                   AND j.visible_at > clock_timestamp()
                                  THEN j.visible_at END,
            attempt_id = NULL, claimed_by = NULL, run_deadline_at = NULL,
            finished_at = now(), retain_until = now() + j.ttl,
            reason = p_reason, error = p_reason
        WHERE j.job_id = ANY(ids) AND j.status IN ('waiting', 'pending', 'running')
        RETURNING j.job_id, j.status, j.parent_id, j.stopping_attempt_id
    LOOP
        IF made.stopping_attempt_id IS NOT NULL THEN
            PERFORM pg_notify(current_schema() || '.stop', made.job_id::text);
        END IF;
        touched := touched || made.job_id;
        job_id := made.job_id; status := made.status; parent_id := made.parent_id;
        refusal := NULL;
        RETURN NEXT;
    END LOOP;
    RETURN QUERY
    SELECT i.id, j.status, j.parent_id,
           CASE WHEN j.job_id IS NULL THEN 'not_found' ELSE 'finished' END
    FROM unnest(ids) AS i (id) LEFT JOIN {schema}.jobs j ON j.job_id = i.id
    WHERE NOT i.id = ANY(touched);
END;
$$;

-- A command's environment, for an operator who asks ---------------------------------------

-- Every action's `env` (index, name, env) of one job, recorded with who asked and why.
CREATE FUNCTION {schema}.operator_reveal_env(p_job_id uuid, p_actor text, p_reason text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    acts jsonb;
BEGIN
    SELECT j.actions INTO acts FROM {schema}.jobs j WHERE j.job_id = p_job_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JF404', DETAIL = p_job_id::text,
            MESSAGE = format('job %s not found', p_job_id);
    END IF;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, 'env_revealed', p_job_id::text, jsonb_build_object('reason', p_reason));
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'index', a.i - 1, 'name', a.x -> 'name', 'env', a.x -> 'params' -> 'env')
                ORDER BY a.i), '[]'::jsonb)
            FROM jsonb_array_elements(acts) WITH ORDINALITY AS a (x, i)
            WHERE jsonb_typeof(a.x -> 'params' -> 'env') = 'object');
END;
$$;

-- The minutes behind the queue page's chart ----------------------------------------------

ALTER TABLE {schema}.job_metric_deltas ADD COLUMN at timestamptz NOT NULL DEFAULT now();

CREATE TABLE {schema}.job_metric_history (
    minute timestamptz NOT NULL,
    queue  text NOT NULL,
    name   text NOT NULL,
    label  text NOT NULL,
    le     float8 NOT NULL,
    value  float8 NOT NULL,
    PRIMARY KEY (minute, queue, name, label, le)
);
CREATE INDEX job_metric_history_queue ON {schema}.job_metric_history (queue, minute);
