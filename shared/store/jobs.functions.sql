-- Database functions of a job's row: the bounds every role's function checks, its audit
-- trail and the rules its triggers keep (born fresh, a retry's new run), and the operator's
-- verbs on jobs (store/jobs.py runs them through jobs.sql).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- Every number a role's function takes is bounded here as well as in the settings: a
-- login is no more trusted than its settings. A value outside [min, max] is an error.
CREATE OR REPLACE FUNCTION {schema}.jobfence_check_bounds(p_name text, p_value float8,
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

-- The bound every batch verb checks: as many rows as a claim may take.
CREATE OR REPLACE FUNCTION {schema}.jobfence_check_batch(p_name text, p_rows integer)
RETURNS void LANGUAGE plpgsql IMMUTABLE SET search_path = {schema}, pg_temp AS $$
BEGIN
    IF p_rows IS NULL OR p_rows > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('%s: at most 1000 rows in one batch, not %s', p_name,
                             coalesce(p_rows::text, 'null'));
    END IF;
END
$$;

-- The delay before the next attempt: exponential in the attempt number, capped, with jitter
-- (half to all of it). Runs with its caller's rights.
CREATE OR REPLACE FUNCTION {schema}.jobfence_retry_delay(attempt integer,
                                                        base_seconds float8,
                                                        cap_seconds float8)
RETURNS interval
LANGUAGE sql SET search_path = {schema}, pg_temp AS $$
    SELECT make_interval(secs => d * (0.5 + random() * 0.5))
    FROM (SELECT least(cap_seconds, base_seconds * power(2, greatest(attempt, 1) - 1)) AS d) s
$$;

-- Workers waiting for work on these queues are told, on `<schema>.ready`, one notification
-- per queue, delivered at commit (worker/wakeup.py): called by the audit triggers with the
-- queues of a statement's pending jobs — ready now, or later (a run_at, a retry's backoff,
-- a snooze): a worker told looks, and one that finds nothing while it runs others asks when
-- the next is due (worker_next_due) and looks again then. Nothing for no queue.
CREATE OR REPLACE FUNCTION {schema}.jobfence_ready(p_queues text[]) RETURNS void
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '.ready', q) FROM unnest(p_queues) AS q
    WHERE q IS NOT NULL;
END
$$;

-- The audit trail of a statement's new jobs: one event each (the statement's transition
-- table), written by the trigger alone, as the owner role.
CREATE OR REPLACE FUNCTION {schema}.jobfence_audit_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    INSERT INTO {schema}.job_events (job_id, from_status, to_status, attempt_id, reason)
    SELECT n.job_id, NULL, n.status, n.attempt_id, n.reason FROM new_rows n;
    PERFORM {schema}.jobfence_ready(array_agg(DISTINCT n.queue)) FROM new_rows n
    WHERE n.status = 'pending';
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS jobs_audit_insert ON {schema}.jobs;
CREATE TRIGGER jobs_audit_insert AFTER INSERT ON {schema}.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.jobfence_audit_insert();

-- The audit trail of a statement's changed jobs: one event per row whose status or fence
-- changed (the attempt it held before, else the one it holds now); the watchers of a job
-- that finished told; what the statement adds to the job metrics.
CREATE OR REPLACE FUNCTION {schema}.jobfence_audit_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp
SET enable_nestloop = off SET jit = off AS $$
BEGIN
    INSERT INTO {schema}.job_events (job_id, from_status, to_status, attempt_id, reason)
    SELECT n.job_id, o.status, n.status, coalesce(o.attempt_id, n.attempt_id), n.reason
    FROM old_rows o JOIN new_rows n USING (job_id)
    WHERE o.status IS DISTINCT FROM n.status OR o.attempt_id IS DISTINCT FROM n.attempt_id;
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.finished', n.job_id::text)
    FROM new_rows n JOIN {schema}.job_watchers w ON w.job_id = n.job_id
    WHERE n.status IN ('succeeded', 'failed', 'cancelled');
    PERFORM {schema}.jobfence_ready(array_agg(DISTINCT n.queue)) FROM new_rows n
    WHERE n.status = 'pending';
    -- What the statement adds to the job metrics, one row per (queue, metric, bucket): each
    -- changed job read once, the rows it adds listed beside it (a lateral VALUES, the one
    -- nested loop; the transition tables' join plans without, and never JIT-compiled: its
    -- cost would be the disabled loop's, not the work's). A parent's finalization looks up
    -- when its last child ended: once per parent, by its children's index, in the
    -- transaction that finalizes it.
    WITH t AS MATERIALIZED (
        SELECT n.queue, o.status AS was, n.status AS now, n.reason,
               CASE WHEN o.status = 'pending' AND n.status = 'running'
                    THEN greatest(0, extract(epoch FROM n.claimed_at - o.visible_at))
               END AS waited,
               CASE WHEN o.status = 'running' AND n.status IN ('succeeded', 'failed', 'cancelled')
                    THEN greatest(0, extract(epoch FROM clock_timestamp() - o.claimed_at))
               END AS ran,
               CASE WHEN n.is_parent AND o.status = 'running'
                         AND n.status IN ('succeeded', 'failed')
                    THEN greatest(0, extract(epoch FROM clock_timestamp() - (
                        SELECT max(c.finished_at) FROM {schema}.jobs c
                        WHERE c.parent_id = n.job_id)))
               END AS finalized_after
        FROM old_rows o JOIN new_rows n USING (job_id)
        WHERE o.status IS DISTINCT FROM n.status
    )
    INSERT INTO {schema}.job_metric_deltas (queue, name, label, le, value)
    SELECT t.queue, m.name, m.label, m.le, sum(m.value)
    FROM t CROSS JOIN LATERAL (VALUES
        (CASE WHEN t.now IN ('succeeded', 'failed', 'cancelled') THEN 'finished' END,
         t.now, 'Infinity'::float8, 1::float8),
        (CASE WHEN t.was = 'running' THEN 'attempts' END,
         CASE WHEN t.now IN ('succeeded', 'cancelled') THEN t.now
              WHEN t.reason LIKE 'lease expired%' OR t.reason LIKE 'worker pod %' THEN 'lost'
              WHEN t.now = 'pending' AND t.reason = 'worker received SIGTERM'
              THEN 'interrupted'
              WHEN t.now = 'pending' THEN 'retried'
              ELSE 'failed' END,
         'Infinity', 1),
        (CASE WHEN t.waited IS NOT NULL THEN 'wait' END, '',
         {schema}.jobfence_bucket('wait', t.waited), 1),
        (CASE WHEN t.waited IS NOT NULL THEN 'wait_sum' END, '', 'Infinity', t.waited),
        (CASE WHEN t.ran IS NOT NULL THEN 'run' END, '', {schema}.jobfence_bucket('run', t.ran),
         1),
        (CASE WHEN t.ran IS NOT NULL THEN 'run_sum' END, '', 'Infinity', t.ran),
        (CASE WHEN t.finalized_after IS NOT NULL THEN 'finalize_lag' END, '',
         {schema}.jobfence_bucket('lag', t.finalized_after), 1),
        (CASE WHEN t.finalized_after IS NOT NULL THEN 'finalize_lag_sum' END, '', 'Infinity',
         t.finalized_after),
        -- A worker that stopped an action for going quiet (or past the job's timeout)
        -- gives the job back with that reason: pending for a retry, or failed.
        (CASE WHEN t.was = 'running' AND t.now IN ('pending', 'failed')
                   AND t.reason IN ('inactive', 'timed out') THEN 'stops' END,
         CASE t.reason WHEN 'inactive' THEN 'inactive' ELSE 'timed_out' END, 'Infinity', 1)
    ) AS m (name, label, le, value)
    WHERE m.name IS NOT NULL
    GROUP BY t.queue, m.name, m.label, m.le;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS jobs_audit_update ON {schema}.jobs;
CREATE TRIGGER jobs_audit_update AFTER UPDATE ON {schema}.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.jobfence_audit_update();

-- Each claim's audit event keeps the attempt number it ran as (the job's attempt_count
-- as the claim wrote it).
CREATE OR REPLACE FUNCTION {schema}.jobfence_event_attempt() RETURNS trigger
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
BEGIN
    NEW.attempt := (SELECT j.attempt_count FROM {schema}.jobs j WHERE j.job_id = NEW.job_id);
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS job_events_attempt ON {schema}.job_events;
CREATE TRIGGER job_events_attempt
    BEFORE INSERT ON {schema}.job_events
    FOR EACH ROW
    WHEN (NEW.to_status = 'running' AND NEW.from_status IS DISTINCT FROM 'running')
    EXECUTE FUNCTION {schema}.jobfence_event_attempt();

-- A job is born the way an enqueue makes one: waiting or pending (a datum parent running),
-- no fence, no attempt, not finished. Only a login acting as the owner role (migrations,
-- a DBA) may insert anything else; the check runs only for a row that is not born fresh.
CREATE OR REPLACE FUNCTION {schema}.jobfence_refuse_forged_job() RETURNS trigger
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

DROP TRIGGER IF EXISTS jobs_born_fresh ON {schema}.jobs;
CREATE TRIGGER jobs_born_fresh BEFORE INSERT ON {schema}.jobs FOR EACH ROW
    WHEN (NOT (NEW.status IN ('waiting', 'pending') OR (NEW.status = 'running' AND NEW.is_parent))
          OR NEW.attempt_id IS NOT NULL OR NEW.attempt_count <> 0 OR NEW.interruptions <> 0
          OR NEW.snoozes <> 0
          OR NEW.finished_at IS NOT NULL OR NEW.claimed_by IS NOT NULL
          OR NEW.claimed_at IS NOT NULL OR NEW.manifest IS NOT NULL
          OR NEW.stopping_attempt_id IS NOT NULL)
    EXECUTE FUNCTION {schema}.jobfence_refuse_forged_job();

-- A retry begins the job's next run, with its snoozes afresh.
CREATE OR REPLACE FUNCTION {schema}.jobfence_retry_starts_run() RETURNS trigger
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
BEGIN
    NEW.snoozes := 0;
    NEW.run := OLD.run + 1;
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS jobs_retry_starts_run ON {schema}.jobs;
CREATE TRIGGER jobs_retry_starts_run
    BEFORE UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (OLD.status IN ('failed', 'cancelled') AND NEW.status IN ('pending', 'waiting'))
    EXECUTE FUNCTION {schema}.jobfence_retry_starts_run();

-- Every action result belongs to its job's run at the time it is written.
CREATE OR REPLACE FUNCTION {schema}.jobfence_result_run() RETURNS trigger
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
BEGIN
    NEW.run := coalesce((SELECT j.run FROM {schema}.jobs j WHERE j.job_id = NEW.job_id), 0);
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS job_action_results_run ON {schema}.job_action_results;
CREATE TRIGGER job_action_results_run
    BEFORE INSERT ON {schema}.job_action_results
    FOR EACH ROW
    EXECUTE FUNCTION {schema}.jobfence_result_run();

-- Cancel a job that is not terminal yet, and a parent's unfinished children (children
-- first: the order a finishing child takes). A running attempt is kept as stopping until
-- its worker confirms its command is gone, or its lease runs out; its worker is told now.
CREATE OR REPLACE FUNCTION {schema}.operator_cancel(p_job_id uuid, p_reason text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    made record;
    refused text;
    found_status text;
BEGIN
    -- One job is a selection of one: the rules are operator_cancel_many's.
    FOR made IN SELECT * FROM {schema}.operator_cancel_many(ARRAY[p_job_id], p_reason) LOOP
        IF made.refusal IS NULL THEN
            job_id := made.job_id; status := made.status; parent_id := made.parent_id;
            RETURN NEXT;
        ELSE
            refused := made.refusal;
            found_status := made.status;
        END IF;
    END LOOP;
    IF refused = 'not_found' OR p_job_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JF404', DETAIL = p_job_id::text,
            MESSAGE = format('job %s not found', p_job_id);
    ELSIF refused IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'JF409',
            MESSAGE = format('job %s is already %s', p_job_id, found_status);
    END IF;
END;
$$;

-- operator_cancel for each of at most 1,000 jobs: a parent's unfinished children first,
-- then the jobs; a running attempt kept as stopping and its worker told. A job already
-- finished (or cancelled with its parent just now) answers `finished`; one not there,
-- `not_found`.
CREATE OR REPLACE FUNCTION {schema}.operator_cancel_many(p_job_ids uuid[], p_reason text)
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

-- A failed or cancelled job (not a parent, nor a child of a finished parent) runs again:
-- pending now (waiting, when it has dependencies, for its caller to settle), a new attempt
-- budget, no fence, its error kept in the audit trail only. Its resource must be free (the
-- unique index decides), and a cancelled attempt of it must have stopped: until its worker
-- confirms its command is gone (or its lease has run out), a retry would run beside it.
CREATE OR REPLACE FUNCTION {schema}.operator_retry(p_job_id uuid, p_reason text)
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
        status = CASE WHEN EXISTS (SELECT FROM {schema}.job_dependencies d
                                   WHERE d.job_id = j.job_id)
                      THEN 'waiting' ELSE 'pending' END,
        attempt_count = 0, interruptions = 0, attempt_id = NULL,
        claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, run_deadline_at = NULL,
        stopping_attempt_id = NULL, stopping_until = NULL,
        visible_at = now(), expires_at = NULL, finished_at = NULL, retain_until = NULL,
        error = NULL, error_detail = NULL, reason = p_reason
    WHERE j.job_id = p_job_id
    RETURNING j.job_id, j.status;
END;
$$;

-- operator_retry for each of at most 1,000 jobs: the same rules, a refusal per job instead
-- of an exception (not_found, not_failed_or_cancelled, parent, stopping,
-- parent_not_running, resource_busy). Rows are locked in id order. A job holding a
-- resource is retried on its own (a subtransaction) so that a busy resource refuses that
-- job alone; the others go in one statement.
CREATE OR REPLACE FUNCTION {schema}.operator_retry_many(p_job_ids uuid[], p_reason text)
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
        status = CASE WHEN EXISTS (SELECT FROM {schema}.job_dependencies d
                                   WHERE d.job_id = j.job_id)
                      THEN 'waiting' ELSE 'pending' END,
        attempt_count = 0, interruptions = 0, attempt_id = NULL,
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
                status = CASE WHEN EXISTS (SELECT FROM {schema}.job_dependencies d
                                           WHERE d.job_id = j.job_id)
                              THEN 'waiting' ELSE 'pending' END,
                attempt_count = 0, interruptions = 0, attempt_id = NULL,
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

-- Every action's `env` (index, name, env) of one job, recorded with who asked and why.
CREATE OR REPLACE FUNCTION {schema}.operator_reveal_env(
    p_job_id uuid, p_actor text, p_reason text)
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

-- A succeeded job's committed outputs: the confirmed files of the attempt that won
-- (p_attempt_id), and of every earlier attempt of its run (p_run) that finished an action
-- (a resumed run skipped those actions; their files are its outputs). What a parent's
-- manifest lists and what a workflow step hands on. A SQL function without SET, inlined
-- into the statement that calls it (as one of its own would cost a plan at each call).
CREATE OR REPLACE FUNCTION {schema}.jobfence_committed_outputs(p_job_id uuid,
                                                               p_attempt_id uuid,
                                                               p_run integer)
RETURNS TABLE (path text, url text, created_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT o.path, o.url, o.created_at FROM {schema}.job_outputs o
    WHERE o.job_id = p_job_id AND o.status = 'done'
      AND (o.attempt_id = p_attempt_id
           OR EXISTS (SELECT FROM {schema}.job_action_results r
                      WHERE r.job_id = p_job_id AND r.attempt_id = o.attempt_id
                        AND r.status = 'succeeded' AND r.run = p_run));
$$;
