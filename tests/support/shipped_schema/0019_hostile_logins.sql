-- 0019: boundaries that hold against a hostile login (invariant 13), and no overlap after a
-- cancel (invariant 12).
--
-- From this migration on, a migration names every object with its schema ({schema}, filled
-- in as a quoted identifier, as in the named statements) and every function pins its
-- search path to `{schema}, pg_temp`: PostgreSQL searches pg_temp FIRST for relations
-- unless it is listed, so a function whose path lacks it resolves a name in the caller's
-- temporary schema before its own. The audit trigger function of 0015 was such a function:
-- a login that created a temporary `job_events` redirected its own transitions' audit
-- trail there. Every function of the schema is re-created here with qualified names.
--
-- * Roles hold their verbs only. The operator role no longer updates jobs, queues, the
--   drain switch or the manual triggers directly: it runs the functions below, each doing
--   what one operator command does, each audited (job_events for jobs, control_events for
--   queues, drain and triggers). A job it inserts is born the way an enqueue makes one
--   (jobs_born_fresh). The worker's functions answer only about the attempt they are
--   given, a NULL attempt never holds, and every number they take is bounded here too.
-- * Stopping. A cancel (or a run timeout enforced by lifecycle) of a running job rotates
--   the fence while the attempt's command may still run. The attempt is kept as
--   `stopping_attempt_id` until its worker confirms its command is gone (worker_stopped)
--   or its lease has run out (`stopping_until`, cleared by the sweeper): meanwhile the job
--   keeps its resource (jobs_resource_active counts it), is not claimed again, and retry
--   refuses it. The worker hears of the rotation at once: a notification on the channel
--   `<schema>.stop` carries the job id.

COMMENT ON SCHEMA {schema} IS 'a jobfence installation: its objects are managed by jobfence migrate';

-- The stopping attempt ------------------------------------------------------------------

ALTER TABLE {schema}.jobs ADD COLUMN stopping_attempt_id uuid;
ALTER TABLE {schema}.jobs ADD COLUMN stopping_until timestamptz;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_stopping_has_deadline
    CHECK ((stopping_attempt_id IS NULL) = (stopping_until IS NULL));

-- The resource stays held while a cancelled attempt is stopping. Same name as before, so
-- that every release maps its violation to "resource busy".
CREATE UNIQUE INDEX jobs_resource_held ON {schema}.jobs (resource)
    WHERE resource IS NOT NULL
      AND (status IN ('waiting', 'pending', 'running') OR stopping_attempt_id IS NOT NULL);
DROP INDEX {schema}.jobs_resource_active;
ALTER INDEX {schema}.jobs_resource_held RENAME TO jobs_resource_active;

-- The sweeper's look for stopping marks whose lease has run out (few rows, ever).
CREATE INDEX jobs_stopping ON {schema}.jobs (stopping_until)
    WHERE stopping_attempt_id IS NOT NULL;

-- Who changed a queue, the drain switch or triggered a function, and why ---------------

CREATE TABLE {schema}.control_events (
    event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    login    text NOT NULL DEFAULT session_user,
    actor    text,
    action   text NOT NULL,
    subject  text,
    detail   jsonb NOT NULL DEFAULT '{{}}'::jsonb
);
CREATE INDEX control_events_at ON {schema}.control_events (at);

-- Helpers (not SECURITY DEFINER: they run with their caller's rights) --------------------

CREATE OR REPLACE FUNCTION {schema}.jobfence_retry_delay(attempt integer,
                                                        base_seconds float8,
                                                        cap_seconds float8)
RETURNS interval
LANGUAGE sql SET search_path = {schema}, pg_temp AS $$
    SELECT make_interval(secs => d * (0.5 + random() * 0.5))
    FROM (SELECT least(cap_seconds, base_seconds * power(2, greatest(attempt, 1) - 1)) AS d) s
$$;

-- A rotation of running jobs' fences by a periodic pass: back to pending with backoff, or
-- failed once attempts are exhausted. Where `stops` says so (a run timeout, a pod whose
-- node stopped answering: its worker may still be running the command), the attempt is
-- kept as stopping until its lease's end, and its worker is told at once.
CREATE FUNCTION {schema}.jobfence_reclaim(ids uuid[], reasons text[], errors text[],
                                         base_seconds float8, cap_seconds float8,
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
ALTER FUNCTION {schema}.jobfence_reclaim(uuid[], text[], text[], float8, float8)
    SET search_path = {schema}, pg_temp;

-- The audit trail, written by triggers alone --------------------------------------------

CREATE OR REPLACE FUNCTION {schema}.jobfence_audit_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    INSERT INTO {schema}.job_events (job_id, from_status, to_status, attempt_id, reason)
    SELECT n.job_id, NULL, n.status, n.attempt_id, n.reason FROM new_rows n;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION {schema}.jobfence_audit_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp
SET enable_nestloop = off AS $$
BEGIN
    INSERT INTO {schema}.job_events (job_id, from_status, to_status, attempt_id, reason)
    SELECT n.job_id, o.status, n.status, coalesce(o.attempt_id, n.attempt_id), n.reason
    FROM old_rows o JOIN new_rows n USING (job_id)
    WHERE o.status IS DISTINCT FROM n.status OR o.attempt_id IS DISTINCT FROM n.attempt_id;
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.finished', n.job_id::text)
    FROM new_rows n JOIN {schema}.job_watchers w ON w.job_id = n.job_id
    WHERE n.status IN ('succeeded', 'failed', 'cancelled');
    -- What the statement adds to the job metrics, one row per (queue, metric, bucket); no
    -- join but the one above (this function plans without nested loops).
    WITH t AS MATERIALIZED (
        SELECT n.queue, o.status AS was, n.status AS now, n.reason,
               CASE WHEN o.status = 'pending' AND n.status = 'running'
                    THEN greatest(0, extract(epoch FROM n.claimed_at - o.visible_at))
               END AS waited,
               CASE WHEN o.status = 'running' AND n.status IN ('succeeded', 'failed', 'cancelled')
                    THEN greatest(0, extract(epoch FROM clock_timestamp() - o.claimed_at))
               END AS ran
        FROM old_rows o JOIN new_rows n USING (job_id)
        WHERE o.status IS DISTINCT FROM n.status
    )
    INSERT INTO {schema}.job_metric_deltas (queue, name, label, le, value)
    SELECT m.queue, m.name, m.label, m.le, sum(m.value)
    FROM (
        SELECT queue, 'finished' AS name, now AS label, 'Infinity'::float8 AS le,
               1::float8 AS value
        FROM t WHERE now IN ('succeeded', 'failed', 'cancelled')
        UNION ALL
        SELECT queue, 'attempts',
               CASE WHEN now IN ('succeeded', 'cancelled') THEN now
                    WHEN reason LIKE 'lease expired%' OR reason LIKE 'worker pod %' THEN 'lost'
                    WHEN now = 'pending' AND reason = 'worker received SIGTERM'
                    THEN 'interrupted'
                    WHEN now = 'pending' THEN 'retried'
                    ELSE 'failed' END,
               'Infinity', 1
        FROM t WHERE was = 'running'
        UNION ALL
        SELECT queue, 'wait', '', {schema}.jobfence_bucket('wait', waited), 1
        FROM t WHERE waited IS NOT NULL
        UNION ALL
        SELECT queue, 'wait_sum', '', 'Infinity', waited FROM t WHERE waited IS NOT NULL
        UNION ALL
        SELECT queue, 'run', '', {schema}.jobfence_bucket('run', ran), 1
        FROM t WHERE ran IS NOT NULL
        UNION ALL
        SELECT queue, 'run_sum', '', 'Infinity', ran FROM t WHERE ran IS NOT NULL
    ) m
    GROUP BY m.queue, m.name, m.label, m.le;
    RETURN NULL;
END
$$;

-- A job is born the way an enqueue makes one: waiting or pending (a datum parent running),
-- no fence, no attempt, not finished. Only a login acting as the owner role (migrations,
-- a DBA) may insert anything else; the check runs only for a row that is not born fresh.
CREATE FUNCTION {schema}.jobfence_refuse_forged_job() RETURNS trigger
LANGUAGE plpgsql SECURITY INVOKER SET search_path = {schema}, pg_temp AS $$
BEGIN
    IF to_regrole(TG_TABLE_SCHEMA || '_owner') IS NULL
       OR pg_has_role(current_user, TG_TABLE_SCHEMA || '_owner', 'USAGE') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_born_fresh',
        MESSAGE = 'a new job must be waiting or pending (a datum parent running), with no '
                  'fence, no attempt and no finish: only its worker moves it on';
END
$$;
CREATE TRIGGER jobs_born_fresh BEFORE INSERT ON {schema}.jobs FOR EACH ROW
    WHEN (NOT (NEW.status IN ('waiting', 'pending') OR (NEW.status = 'running' AND NEW.is_parent))
          OR NEW.attempt_id IS NOT NULL OR NEW.attempt_count <> 0 OR NEW.interruptions <> 0
          OR NEW.finished_at IS NOT NULL OR NEW.claimed_by IS NOT NULL
          OR NEW.claimed_at IS NOT NULL OR NEW.manifest IS NOT NULL
          OR NEW.stopping_attempt_id IS NOT NULL)
    EXECUTE FUNCTION {schema}.jobfence_refuse_forged_job();

-- For every role -----------------------------------------------------------------------

CREATE OR REPLACE FUNCTION {schema}.jobfence_identity()
RETURNS TABLE (installation text, identified_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT c.installation, c.identified_at FROM {schema}.jobfence_control c;
$$;

-- Settling what waited (see 0014 for the reasoning; the same statements, qualified) ------

CREATE OR REPLACE FUNCTION {schema}.resolve_waiting(p_job_ids uuid[])
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    started uuid[] := '{{}}';
    failed uuid[] := '{{}}';
    made record;
BEGIN
    FOR made IN WITH verdict AS (
        SELECT ids.job_id, v.active, v.failure
        FROM unnest(p_job_ids) AS ids (job_id)
        CROSS JOIN LATERAL (
            SELECT count(*) FILTER (WHERE s.status IN ('waiting', 'pending', 'running'))
                       AS active,
                min(CASE
                    WHEN s.status IS NULL THEN 'dependency ' || dep.depends_on || ' missing'
                    WHEN s.status IN ('failed', 'cancelled')
                        THEN 'dependency ' || dep.depends_on || ' ' || s.status
                END) AS failure,
                count(*) AS deps
            FROM {schema}.job_dependencies dep
            CROSS JOIN LATERAL (SELECT (SELECT d.status FROM {schema}.jobs d
                                        WHERE d.job_id = dep.depends_on) AS status) s
            WHERE dep.job_id = ids.job_id
        ) v
        WHERE v.deps > 0
    ), written AS (
        UPDATE {schema}.jobs j SET
            status = CASE WHEN v.failure IS NOT NULL THEN 'failed'
                          WHEN j.is_parent THEN 'running' ELSE 'pending' END,
            visible_at = greatest(now(), coalesce(j.run_at, now())),
            finished_at = CASE WHEN v.failure IS NOT NULL THEN now() END,
            retain_until = CASE WHEN v.failure IS NOT NULL THEN now() + j.ttl END,
            started_at = CASE WHEN v.failure IS NULL AND j.is_parent THEN now() END,
            reason = coalesce(v.failure, 'dependencies succeeded'),
            error = v.failure
        FROM verdict v
        WHERE j.job_id = v.job_id AND j.status = 'waiting'
          AND (v.failure IS NOT NULL OR v.active = 0)
        RETURNING j.job_id, j.status, j.parent_id, j.is_parent
    ) SELECT * FROM written
    LOOP
        job_id := made.job_id; status := made.status; parent_id := made.parent_id;
        RETURN NEXT;
        IF made.is_parent AND made.status = 'running' THEN
            started := started || made.job_id;
        ELSIF made.is_parent AND made.status = 'failed' THEN
            failed := failed || made.job_id;
        END IF;
    END LOOP;
    RETURN QUERY
    UPDATE {schema}.jobs c SET status = 'pending',
        visible_at = greatest(now(), coalesce(c.run_at, now())), reason = 'parent started'
    WHERE c.parent_id = ANY(started) AND c.status = 'waiting'
    RETURNING c.job_id, c.status, c.parent_id;
    RETURN QUERY
    UPDATE {schema}.jobs c SET status = 'cancelled', finished_at = now(),
        retain_until = now() + c.ttl,
        reason = 'parent failed before starting', error = 'parent failed before starting'
    WHERE c.parent_id = ANY(failed) AND c.status = 'waiting'
    RETURNING c.job_id, c.status, c.parent_id;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.settle_dependents(p_job_ids uuid[], p_budget integer)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    frontier uuid[] := p_job_ids;
    budget integer := least(greatest(p_budget, 0), 100000);
    waiting_ids uuid[];
    made record;
    next_frontier uuid[];
BEGIN
    WHILE cardinality(frontier) > 0 AND budget > 0 LOOP
        SELECT coalesce(array_agg(DISTINCT d.job_id), '{{}}') INTO waiting_ids FROM (
            SELECT dep.job_id FROM {schema}.job_dependencies dep
            WHERE dep.depends_on = ANY(frontier)
              AND (SELECT j.status FROM {schema}.jobs j WHERE j.job_id = dep.job_id)
                  = 'waiting'
            LIMIT budget) d;
        EXIT WHEN cardinality(waiting_ids) = 0;
        budget := budget - cardinality(waiting_ids);
        next_frontier := '{{}}';
        FOR made IN SELECT * FROM {schema}.resolve_waiting(waiting_ids) LOOP
            job_id := made.job_id; status := made.status; parent_id := made.parent_id;
            RETURN NEXT;
            IF made.status IN ('succeeded', 'failed', 'cancelled') THEN
                next_frontier := next_frontier || made.job_id;
            END IF;
        END LOOP;
        frontier := next_frontier;
    END LOOP;
END;
$$;

-- The worker's verbs ---------------------------------------------------------------------
-- Each names the attempt it acts for (job_id, attempt_id) and matches nothing unless that
-- attempt holds a live lease. Every number is bounded here as well as in the settings: a
-- worker login is no more trusted than its settings.

CREATE FUNCTION {schema}.jobfence_check_bounds(p_name text, p_value float8,
                                              p_min float8, p_max float8)
RETURNS void LANGUAGE plpgsql IMMUTABLE SET search_path = {schema}, pg_temp AS $$
BEGIN
    IF p_value IS NULL OR NOT p_value BETWEEN p_min AND p_max THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('%s must be between %s and %s, not %s', p_name, p_min, p_max,
                             coalesce(p_value::text, 'null'));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_claim(p_queue text, p_worker_id text,
                                                p_lease_seconds float8, p_limit integer)
RETURNS TABLE (job_id uuid, attempt_id uuid, attempt_count integer, max_attempts integer,
               actions jsonb, inputs jsonb, parent_id uuid, lease_expires_at timestamptz,
               run_deadline_at timestamptz, interruptions integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.jobfence_check_bounds('lease_seconds', p_lease_seconds, 0.001, 86400);
    PERFORM {schema}.jobfence_check_bounds('limit', p_limit, 1, 1000);
    PERFORM pg_advisory_xact_lock(27238, hashtext(current_schema() || ':queue:' || p_queue))
    FROM {schema}.queues q WHERE q.name = p_queue AND q.max_running IS NOT NULL;
    RETURN QUERY
    WITH candidate AS (
        SELECT c.job_id FROM {schema}.jobs c
        WHERE c.status = 'pending' AND c.queue = p_queue AND c.visible_at <= now()
          AND c.stopping_attempt_id IS NULL
          AND NOT (SELECT k.draining FROM {schema}.jobfence_control k)
          AND NOT coalesce((SELECT q.paused FROM {schema}.queues q WHERE q.name = p_queue),
                           false)
        ORDER BY c.priority DESC, c.visible_at
        LIMIT (SELECT CASE WHEN q.max_running IS NULL THEN p_limit
                           ELSE greatest(0, least(p_limit, q.max_running - (
                               SELECT count(*) FROM {schema}.jobs r
                               WHERE r.status = 'running' AND r.queue = p_queue
                                 AND NOT r.is_parent))) END
               FROM (SELECT max(q2.max_running) AS max_running FROM {schema}.queues q2
                     WHERE q2.name = p_queue) q)
        FOR UPDATE SKIP LOCKED
    )
    UPDATE {schema}.jobs j SET
        status = 'running',
        attempt_id = gen_random_uuid(),
        attempt_count = j.attempt_count + 1,
        claimed_by = p_worker_id,
        claimed_at = now(),
        heartbeat_at = now(),
        visible_at = now() + make_interval(secs => p_lease_seconds),
        run_deadline_at = now() + j.timeout,
        started_at = coalesce(j.started_at, now()),
        reason = 'claimed by ' || p_worker_id
    WHERE j.job_id = ANY(ARRAY(SELECT c.job_id FROM candidate c))
      AND j.attempt_count < j.max_attempts
    RETURNING j.job_id, j.attempt_id, j.attempt_count, j.max_attempts, j.actions, j.inputs,
        j.parent_id, j.visible_at, j.run_deadline_at, j.interruptions;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_heartbeat(p_job_id uuid, p_attempt_id uuid,
                                                    p_lease_seconds float8)
RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    renewed timestamptz;
BEGIN
    PERFORM {schema}.jobfence_check_bounds('lease_seconds', p_lease_seconds, 0.001, 86400);
    UPDATE {schema}.jobs j SET
        visible_at = now() + make_interval(secs => p_lease_seconds),
        heartbeat_at = now()
    WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
      AND j.status = 'running' AND j.visible_at > clock_timestamp()
    RETURNING j.visible_at INTO renewed;
    RETURN renewed;
END;
$$;

-- Which of the given attempts still hold their job's fence with a live lease: the
-- worker's cheap look, every fraction of a second, for a cancel it was not told of.
CREATE FUNCTION {schema}.worker_holding(p_job_ids uuid[], p_attempt_ids uuid[])
RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT j.job_id
    FROM unnest(p_job_ids[1:1000], p_attempt_ids[1:1000]) AS a (job_id, attempt_id)
    JOIN {schema}.jobs j ON j.job_id = a.job_id AND j.attempt_id = a.attempt_id
    WHERE j.status = 'running' AND j.visible_at > clock_timestamp();
$$;

-- The attempt whose fence was rotated confirms that its command is gone: its job's
-- resource is free, and the job may be claimed again.
CREATE FUNCTION {schema}.worker_stopped(p_job_id uuid, p_attempt_id uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    UPDATE {schema}.jobs j SET stopping_attempt_id = NULL, stopping_until = NULL
    WHERE j.job_id = p_job_id AND j.stopping_attempt_id = p_attempt_id;
    RETURN FOUND;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_record_action(p_job_id uuid, p_attempt_id uuid,
    p_action_index integer, p_name text, p_status text, p_started_at timestamptz,
    p_result jsonb, p_error text, p_error_detail text)
RETURNS SETOF integer
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    WITH fence AS (
        SELECT j.job_id, j.attempt_id FROM {schema}.jobs j
        WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
          AND j.status = 'running' AND j.visible_at > clock_timestamp()
        FOR SHARE
    )
    INSERT INTO {schema}.job_action_results AS r (
        job_id, attempt_id, action_index, name, status, started_at, result, error, error_detail
    )
    SELECT f.job_id, f.attempt_id, p_action_index, p_name, p_status, p_started_at, p_result,
        p_error, p_error_detail
    FROM fence f
    ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
        status = excluded.status, result = excluded.result, error = excluded.error,
        error_detail = excluded.error_detail, finished_at = excluded.finished_at
    RETURNING r.action_index;
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_finish(p_job_id uuid, p_attempt_id uuid,
    p_status text, p_reason text, p_error text, p_error_detail text,
    p_action_index integer, p_action_name text, p_action_status text,
    p_action_started_at timestamptz, p_action_result jsonb, p_action_error text,
    p_action_error_detail text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    WITH written AS (
        UPDATE {schema}.jobs j SET
            status = p_status,
            finished_at = now(),
            retain_until = now() + j.ttl,
            run_deadline_at = NULL,
            reason = p_reason,
            error = p_error,
            error_detail = p_error_detail
        WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
          AND p_status IN ('succeeded', 'failed')
          AND j.status = 'running' AND j.visible_at > clock_timestamp()
        RETURNING j.job_id, j.status, j.parent_id
    ), recorded AS (
        INSERT INTO {schema}.job_action_results (
            job_id, attempt_id, action_index, name, status, started_at, result, error,
            error_detail
        )
        SELECT w.job_id, p_attempt_id, p_action_index, p_action_name, p_action_status,
            p_action_started_at, p_action_result, p_action_error, p_action_error_detail
        FROM written w
        WHERE p_action_index IS NOT NULL
        ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
            status = excluded.status, result = excluded.result, error = excluded.error,
            error_detail = excluded.error_detail, finished_at = excluded.finished_at
    )
    SELECT w.job_id, w.status, w.parent_id FROM written w;
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_release(p_job_id uuid, p_attempt_id uuid,
    p_base_seconds float8, p_cap_seconds float8, p_reason text, p_error text,
    p_error_detail text, p_action_index integer, p_action_name text, p_action_status text,
    p_action_started_at timestamptz, p_action_result jsonb, p_action_error text,
    p_action_error_detail text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.jobfence_check_bounds('base_seconds', p_base_seconds, 0, 86400);
    PERFORM {schema}.jobfence_check_bounds('cap_seconds', p_cap_seconds, 0, 30 * 86400);
    RETURN QUERY
    WITH written AS (
        UPDATE {schema}.jobs j SET
            status = CASE WHEN j.attempt_count >= j.max_attempts THEN 'failed'
                          ELSE 'pending' END,
            attempt_id = CASE WHEN j.attempt_count >= j.max_attempts THEN j.attempt_id END,
            visible_at = now() + {schema}.jobfence_retry_delay(j.attempt_count,
                                                               p_base_seconds, p_cap_seconds),
            finished_at = CASE WHEN j.attempt_count >= j.max_attempts THEN now() END,
            retain_until = CASE WHEN j.attempt_count >= j.max_attempts
                                THEN now() + j.ttl END,
            claimed_by = NULL,
            run_deadline_at = NULL,
            reason = p_reason,
            error = p_error,
            error_detail = p_error_detail
        WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
          AND j.status = 'running' AND j.visible_at > clock_timestamp()
        RETURNING j.job_id, j.status, j.parent_id
    ), recorded AS (
        INSERT INTO {schema}.job_action_results (
            job_id, attempt_id, action_index, name, status, started_at, result, error,
            error_detail
        )
        SELECT w.job_id, p_attempt_id, p_action_index, p_action_name, p_action_status,
            p_action_started_at, p_action_result, p_action_error, p_action_error_detail
        FROM written w
        WHERE p_action_index IS NOT NULL
        ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
            status = excluded.status, result = excluded.result, error = excluded.error,
            error_detail = excluded.error_detail, finished_at = excluded.finished_at
    )
    SELECT w.job_id, w.status, w.parent_id FROM written w;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_interrupt(p_job_id uuid, p_attempt_id uuid,
                                                    p_reason text,
                                                    p_max_interruptions integer)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.jobfence_check_bounds('max_interruptions', p_max_interruptions, 0,
                                          1000000);
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        status = CASE WHEN j.interruptions < p_max_interruptions
                        OR j.attempt_count < j.max_attempts THEN 'pending' ELSE 'failed' END,
        attempt_count = CASE WHEN j.interruptions < p_max_interruptions
                             THEN j.attempt_count - 1 ELSE j.attempt_count END,
        interruptions = j.interruptions + 1,
        attempt_id = CASE WHEN j.interruptions < p_max_interruptions
                            OR j.attempt_count < j.max_attempts THEN NULL
                          ELSE j.attempt_id END,
        visible_at = now(),
        finished_at = CASE WHEN j.interruptions >= p_max_interruptions
                            AND j.attempt_count >= j.max_attempts THEN now() END,
        retain_until = CASE WHEN j.interruptions >= p_max_interruptions
                             AND j.attempt_count >= j.max_attempts THEN now() + j.ttl END,
        claimed_by = NULL,
        run_deadline_at = NULL,
        reason = p_reason,
        error = p_reason
    WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
      AND j.status = 'running' AND j.visible_at > clock_timestamp()
    RETURNING j.job_id, j.status, j.parent_id;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_register_outputs(p_job_id uuid, p_attempt_id uuid,
                                                           p_outputs jsonb)
RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    WITH fence AS (
        SELECT j.job_id, j.attempt_id FROM {schema}.jobs j
        WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
          AND j.status = 'running' AND j.visible_at > clock_timestamp()
        FOR SHARE
    )
    INSERT INTO {schema}.job_outputs AS o (job_id, attempt_id, path, url, status)
    SELECT f.job_id, f.attempt_id, x.path, x.url, 'running'
    FROM fence f, jsonb_to_recordset(p_outputs) AS x (path text, url text)
    ON CONFLICT (job_id, attempt_id, path) DO UPDATE SET
        status = 'running', url = excluded.url, error = NULL, updated_at = clock_timestamp()
    RETURNING o.path;
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_confirm_outputs(p_job_id uuid, p_attempt_id uuid,
                                                          p_outputs jsonb)
RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    WITH fence AS (
        SELECT j.job_id, j.attempt_id FROM {schema}.jobs j
        WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
          AND j.status = 'running' AND j.visible_at > clock_timestamp()
        FOR SHARE
    )
    UPDATE {schema}.job_outputs o SET
        status = x.status, size_bytes = x.size_bytes, error = x.error,
        updated_at = clock_timestamp()
    FROM fence f, jsonb_to_recordset(p_outputs)
        AS x (path text, status text, size_bytes bigint, error text)
    WHERE o.job_id = f.job_id AND o.attempt_id = f.attempt_id AND o.path = x.path
    RETURNING o.path;
$$;

-- Where a job's fence stands for the attempt asking (after a write whose outcome was lost
-- with the connection, or to say why a heartbeat matched nothing): its status, whether this
-- attempt holds the fence, and why — only for an attempt that was this job's (its trail
-- names it), never for a NULL one, never whose the fence is.
CREATE OR REPLACE FUNCTION {schema}.worker_fence(p_job_id uuid, p_attempt_id uuid)
RETURNS TABLE (status text, holds boolean, reason text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT j.status, j.attempt_id = p_attempt_id, j.reason
    FROM {schema}.jobs j
    WHERE j.job_id = p_job_id AND p_attempt_id IS NOT NULL
      AND (j.attempt_id = p_attempt_id
           OR j.stopping_attempt_id = p_attempt_id
           OR EXISTS (SELECT FROM {schema}.job_events e
                      WHERE e.job_id = p_job_id AND e.attempt_id = p_attempt_id));
$$;

CREATE OR REPLACE FUNCTION {schema}.worker_done_actions(p_job_id uuid, p_attempt_id uuid)
RETURNS SETOF integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT DISTINCT r.action_index FROM {schema}.job_action_results r
    WHERE r.job_id = p_job_id AND r.status = 'succeeded'
      AND EXISTS (SELECT FROM {schema}.jobs j WHERE j.job_id = p_job_id
                  AND j.attempt_id = p_attempt_id AND j.status = 'running');
$$;

-- The operator's verbs ------------------------------------------------------------------
-- What `jobfence cancel`, `retry`, `queue`, `drain` and a manual trigger do, and nothing
-- else. A refusal is an exception with a jobfence SQLSTATE (class JF), which the client
-- maps to its typed error: JF404 no such job, JF409 already terminal, JF410 not
-- retryable, JF503 drain mode is on.

-- Cancel a job that is not terminal yet, and a parent's unfinished children (children
-- first: the order a finishing child takes). A running attempt is kept as stopping until
-- its worker confirms its command is gone, or its lease runs out; its worker is told now.
CREATE FUNCTION {schema}.operator_cancel(p_job_id uuid, p_reason text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    made record;
    cancelled_it boolean := false;
    found_status text;
BEGIN
    FOR made IN
        UPDATE {schema}.jobs c SET
            status = 'cancelled',
            stopping_attempt_id = CASE WHEN c.status = 'running'
                                        AND c.visible_at > clock_timestamp()
                                       THEN c.attempt_id END,
            stopping_until = CASE WHEN c.status = 'running'
                                   AND c.visible_at > clock_timestamp()
                                  THEN c.visible_at END,
            attempt_id = NULL,
            claimed_by = NULL,
            run_deadline_at = NULL,
            finished_at = now(),
            retain_until = now() + c.ttl,
            reason = p_reason,
            error = p_reason
        WHERE c.parent_id = p_job_id AND c.status IN ('waiting', 'pending', 'running')
        RETURNING c.job_id, c.status, c.parent_id, c.stopping_attempt_id
    LOOP
        IF made.stopping_attempt_id IS NOT NULL THEN
            PERFORM pg_notify(current_schema() || '.stop', made.job_id::text);
        END IF;
        job_id := made.job_id; status := made.status; parent_id := made.parent_id;
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
            attempt_id = NULL,
            claimed_by = NULL,
            run_deadline_at = NULL,
            finished_at = now(),
            retain_until = now() + j.ttl,
            reason = p_reason,
            error = p_reason
        WHERE j.job_id = p_job_id AND j.status IN ('waiting', 'pending', 'running')
        RETURNING j.job_id, j.status, j.parent_id, j.stopping_attempt_id
    LOOP
        IF made.stopping_attempt_id IS NOT NULL THEN
            PERFORM pg_notify(current_schema() || '.stop', made.job_id::text);
        END IF;
        cancelled_it := true;
        job_id := made.job_id; status := made.status; parent_id := made.parent_id;
        RETURN NEXT;
    END LOOP;
    IF NOT cancelled_it THEN
        SELECT j.status INTO found_status FROM {schema}.jobs j WHERE j.job_id = p_job_id;
        IF found_status IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'JF404', DETAIL = p_job_id::text,
                MESSAGE = format('job %s not found', p_job_id);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'JF409',
            MESSAGE = format('job %s is already %s', p_job_id, found_status);
    END IF;
END;
$$;

-- A failed or cancelled job (not a parent, nor a child of a finished parent) runs again:
-- pending now, a new attempt budget, no fence, its error kept in the audit trail only. Its
-- resource must be free (the unique index decides), and a cancelled attempt of it must
-- have stopped: until its worker confirms its command is gone (or its lease has run out),
-- a retry would run beside it.
CREATE FUNCTION {schema}.operator_retry(p_job_id uuid, p_reason text)
RETURNS TABLE (job_id uuid, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    job record;
    parent_status text;
BEGIN
    IF (SELECT k.draining FROM {schema}.jobfence_control k FOR SHARE) THEN
        RAISE EXCEPTION USING ERRCODE = 'JF503',
            MESSAGE = 'drain mode is on: retry is refused until `drain off`';
    END IF;
    SELECT j.status, j.is_parent, j.parent_id, j.stopping_attempt_id, j.stopping_until
    INTO job FROM {schema}.jobs j WHERE j.job_id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JF404', DETAIL = p_job_id::text,
            MESSAGE = format('job %s not found', p_job_id);
    END IF;
    IF job.is_parent THEN
        RAISE EXCEPTION USING ERRCODE = 'JF410', MESSAGE = format(
            'job %s is a parent (retry its children): only a failed or cancelled job can '
            'be retried', p_job_id);
    END IF;
    IF job.status NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION USING ERRCODE = 'JF410', MESSAGE = format(
            'job %s is %s: only a failed or cancelled job can be retried', p_job_id,
            job.status);
    END IF;
    IF job.stopping_attempt_id IS NOT NULL AND job.stopping_until > clock_timestamp() THEN
        RAISE EXCEPTION USING ERRCODE = 'JF410', MESSAGE = format(
            'job %s is still stopping: the command of its cancelled attempt is not yet '
            'confirmed gone (at the latest when its lease ends, %s)', p_job_id,
            job.stopping_until);
    END IF;
    IF job.parent_id IS NOT NULL THEN
        SELECT p.status INTO parent_status FROM {schema}.jobs p WHERE p.job_id = job.parent_id;
        IF parent_status IS DISTINCT FROM 'running' THEN
            RAISE EXCEPTION USING ERRCODE = 'JF410', MESSAGE = format(
                'job %s is a child of %s, which is %s: a child runs only while its parent '
                'does', p_job_id, job.parent_id, coalesce(parent_status, 'gone'));
        END IF;
    END IF;
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        status = 'pending', attempt_count = 0, interruptions = 0, attempt_id = NULL,
        claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, run_deadline_at = NULL,
        stopping_attempt_id = NULL, stopping_until = NULL,
        visible_at = now(), expires_at = NULL, finished_at = NULL, retain_until = NULL,
        error = NULL, error_detail = NULL, reason = p_reason
    WHERE j.job_id = p_job_id
    RETURNING j.job_id, j.status;
END;
$$;

-- Pause, resume or limit a queue (the settings not given stay as they are), recorded.
CREATE FUNCTION {schema}.operator_configure_queue(p_queue text, p_paused boolean,
                                                 p_set_limit boolean, p_max_running integer,
                                                 p_reason text, p_actor text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    name text;
BEGIN
    INSERT INTO {schema}.queues AS q (name, paused, max_running, reason, changed_at)
    VALUES (p_queue, coalesce(p_paused, false),
            CASE WHEN p_set_limit THEN p_max_running END, p_reason, now())
    ON CONFLICT ON CONSTRAINT queues_pkey DO UPDATE SET
        paused = coalesce(p_paused, q.paused),
        max_running = CASE WHEN p_set_limit THEN p_max_running ELSE q.max_running END,
        reason = coalesce(p_reason, q.reason),
        changed_at = now()
    RETURNING q.name INTO name;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, CASE WHEN p_set_limit THEN 'queue_limit'
                          WHEN p_paused THEN 'queue_pause' ELSE 'queue_resume' END,
            p_queue, jsonb_build_object('limit', p_max_running, 'reason', p_reason));
    RETURN name;
END;
$$;

-- Switch drain mode on or off, recorded.
CREATE FUNCTION {schema}.operator_set_drain(p_on boolean, p_reason text, p_actor text)
RETURNS TABLE (draining boolean, drain_changed_at timestamptz, drain_reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF p_on IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'drain must be switched on or off';
    END IF;
    INSERT INTO {schema}.control_events (actor, action, detail)
    VALUES (p_actor, CASE WHEN p_on THEN 'drain_on' ELSE 'drain_off' END,
            jsonb_build_object('reason', p_reason));
    RETURN QUERY
    UPDATE {schema}.jobfence_control c
    SET draining = p_on, drain_changed_at = now(), drain_reason = p_reason
    RETURNING c.draining, c.drain_changed_at, c.drain_reason;
END;
$$;

-- A manual trigger of a periodic function: take the function's slot when p_interval
-- seconds have passed since its last trigger, and record who and why; no row when the slot
-- is taken.
CREATE FUNCTION {schema}.operator_trigger_request(p_function text, p_requested_by text,
                                                 p_reason text, p_interval float8)
RETURNS SETOF {schema}.function_triggers
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    PERFORM {schema}.jobfence_check_bounds('interval', p_interval, 0, 86400);
    RETURN QUERY
    WITH slot AS (
        INSERT INTO {schema}.function_trigger_slots AS s (function, last_at)
        VALUES (p_function, clock_timestamp())
        ON CONFLICT ON CONSTRAINT function_trigger_slots_pkey DO UPDATE
        SET last_at = excluded.last_at
        WHERE s.last_at <= excluded.last_at - make_interval(secs => p_interval)
        RETURNING s.function, s.last_at
    )
    INSERT INTO {schema}.function_triggers AS t (function, requested_by, reason, requested_at)
    SELECT slot.function, p_requested_by, p_reason, slot.last_at FROM slot
    RETURNING t.*;
END;
$$;

-- The outcome of a requested trigger: the cluster created its Job (p_job_name), or refused
-- it (p_error: the slot is handed back). Only a trigger still `requested` changes.
CREATE FUNCTION {schema}.operator_trigger_outcome(p_trigger_id bigint, p_job_name text,
                                                 p_error text)
RETURNS SETOF {schema}.function_triggers
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH t AS (
        UPDATE {schema}.function_triggers t SET
            outcome = CASE WHEN p_error IS NULL THEN 'created' ELSE 'failed' END,
            job_name = p_job_name, error = p_error
        WHERE t.trigger_id = p_trigger_id AND t.outcome = 'requested'
        RETURNING t.*
    ), freed AS (
        UPDATE {schema}.function_trigger_slots s SET last_at = '-infinity'
        FROM t WHERE p_error IS NOT NULL AND s.function = t.function
          AND s.last_at = t.requested_at
    )
    SELECT * FROM t;
END;
$$;

-- The maintainer's look for stopping attempts whose lease has run out: their worker never
-- confirmed (it died, or was cut off), and the lease bounds how long it may have run.
CREATE FUNCTION {schema}.jobfence_release_stopped(p_limit integer)
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
