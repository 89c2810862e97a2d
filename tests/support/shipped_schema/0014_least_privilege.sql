-- 0014: least privilege. The worker's role reaches the store only through the functions
-- below: each checks the fence inside the database and runs as the schema's owner
-- (SECURITY DEFINER) with a fixed search path (this schema, then pg_temp last, so that no
-- caller's temporary object can stand in for one of ours). A worker role can claim, renew
-- its lease, record its actions and outputs, write its terminal state and give its job
-- back — for the attempt whose attempt_id it holds — and nothing else: no table is granted
-- to it, and no function returns another job's attempt_id.
--
-- Which role may run what is granted by `jobfence migrate` after the migrations
-- (store/roles.sql), not here: the roles live in the cluster, outside any database.
SELECT set_config('search_path', current_setting('search_path') || ', pg_temp', true);

-- The audit trail is written by the triggers alone: no role needs (or gets) INSERT on
-- job_events, so no role can forge an event.
ALTER FUNCTION jobfence_audit_insert() SECURITY DEFINER;
ALTER FUNCTION jobfence_audit_update() SECURITY DEFINER;
ALTER FUNCTION jobfence_audit_insert() SET search_path FROM CURRENT;
ALTER FUNCTION jobfence_audit_update() SET search_path FROM CURRENT;

-- The installation's identity, for every role (a worker checks it before it claims).
CREATE FUNCTION jobfence_identity()
RETURNS TABLE (installation text, identified_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT installation, identified_at FROM jobfence_control;
$$;

-- Resolve waiting jobs whose dependencies allow it: pending (a parent: running, its
-- waiting children released) once every dependency succeeded; failed, naming the
-- dependency, as soon as one failed, was cancelled or is gone (a parent that failed before
-- starting: its waiting children cancelled). Jobs with a dependency still active stay
-- waiting. Index probes per given job and per dependency (LATERAL and a scalar subquery),
-- so a batch costs the same however many jobs wait in the table. Derived from the
-- database's own state only: any role that makes jobs terminal may run it.
CREATE FUNCTION resolve_waiting(p_job_ids uuid[])
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    started uuid[] := '{}';
    failed uuid[] := '{}';
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
            FROM job_dependencies dep
            CROSS JOIN LATERAL (SELECT (SELECT d.status FROM jobs d
                                        WHERE d.job_id = dep.depends_on) AS status) s
            WHERE dep.job_id = ids.job_id
        ) v
        WHERE v.deps > 0
    ), written AS (
        UPDATE jobs j SET
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
    -- A parent whose dependencies succeeded: its waiting children become claimable.
    RETURN QUERY
    UPDATE jobs SET status = 'pending',
        visible_at = greatest(now(), coalesce(run_at, now())), reason = 'parent started'
    WHERE parent_id = ANY(started) AND status = 'waiting'
    RETURNING job_id, status, parent_id;
    -- A parent that failed before starting: its waiting children will never run.
    RETURN QUERY
    UPDATE jobs SET status = 'cancelled', finished_at = now(), retain_until = now() + ttl,
        reason = 'parent failed before starting', error = 'parent failed before starting'
    WHERE parent_id = ANY(failed) AND status = 'waiting'
    RETURNING job_id, status, parent_id;
END;
$$;

-- Settle what waited on jobs that just became terminal, transitively, at most p_budget
-- dependents (export-finalize pages through the rest). Run after the commit of the
-- terminal writes it follows, so it sees them.
CREATE FUNCTION settle_dependents(p_job_ids uuid[], p_budget integer)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    frontier uuid[] := p_job_ids;
    budget integer := p_budget;
    waiting_ids uuid[];
    made record;
    next_frontier uuid[];
BEGIN
    WHILE cardinality(frontier) > 0 AND budget > 0 LOOP
        -- An index probe per job (most jobs have none), then one per dependency row.
        SELECT coalesce(array_agg(DISTINCT d.job_id), '{}') INTO waiting_ids FROM (
            SELECT dep.job_id FROM job_dependencies dep
            WHERE dep.depends_on = ANY(frontier)
              AND (SELECT j.status FROM jobs j WHERE j.job_id = dep.job_id) = 'waiting'
            LIMIT budget) d;
        EXIT WHEN cardinality(waiting_ids) = 0;
        budget := budget - cardinality(waiting_ids);
        next_frontier := '{}';
        FOR made IN SELECT * FROM resolve_waiting(waiting_ids) LOOP
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

-- The worker's verbs. Each one names the attempt it acts for (job_id, attempt_id) and
-- matches nothing unless that attempt holds a live lease: the fence, checked here.

-- Claim up to p_limit ready jobs of a queue: fresh fence, lease, attempt_count + 1. SKIP
-- LOCKED lets concurrent claimers pass each other; drain mode, or the queue paused, claims
-- nothing. A queue with a limit on running jobs has one claimer at a time (a transaction
-- lock taken before the claim, held until the caller's transaction ends); the claim is the
-- next statement, so it counts the running jobs with a snapshot taken after the previous
-- claimer committed. The candidates go to the update as an array, always read by primary
-- key.
CREATE FUNCTION worker_claim(p_queue text, p_worker_id text, p_lease_seconds float8,
                             p_limit integer)
RETURNS TABLE (job_id uuid, attempt_id uuid, attempt_count integer, max_attempts integer,
               actions jsonb, inputs jsonb, parent_id uuid, lease_expires_at timestamptz,
               run_deadline_at timestamptz, interruptions integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(27238, hashtext(current_schema() || ':queue:' || p_queue))
    FROM queues WHERE name = p_queue AND max_running IS NOT NULL;
    RETURN QUERY
    WITH candidate AS (
        SELECT c.job_id FROM jobs c
        WHERE c.status = 'pending' AND c.queue = p_queue AND c.visible_at <= now()
          AND NOT (SELECT draining FROM jobfence_control)
          AND NOT coalesce((SELECT q.paused FROM queues q WHERE q.name = p_queue), false)
        ORDER BY c.priority DESC, c.visible_at
        LIMIT (SELECT CASE WHEN q.max_running IS NULL THEN p_limit
                           ELSE greatest(0, least(p_limit, q.max_running - (
                               SELECT count(*) FROM jobs r
                               WHERE r.status = 'running' AND r.queue = p_queue
                                 AND NOT r.is_parent))) END
               FROM (SELECT max(max_running) AS max_running FROM queues
                     WHERE name = p_queue) q)
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs j SET
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

-- Renew the lease of a live attempt; NULL when the fence is lost.
CREATE FUNCTION worker_heartbeat(p_job_id uuid, p_attempt_id uuid, p_lease_seconds float8)
RETURNS timestamptz
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    UPDATE jobs SET
        visible_at = now() + make_interval(secs => p_lease_seconds),
        heartbeat_at = now()
    WHERE job_id = p_job_id AND attempt_id = p_attempt_id
      AND status = 'running' AND visible_at > clock_timestamp()
    RETURNING visible_at;
$$;

-- Record one action's result under the fence (FOR SHARE: a concurrent rotation of the
-- fence either waits for this insert or makes it match nothing). Idempotent.
CREATE FUNCTION worker_record_action(p_job_id uuid, p_attempt_id uuid, p_action_index integer,
    p_name text, p_status text, p_started_at timestamptz, p_result jsonb, p_error text,
    p_error_detail text)
RETURNS SETOF integer
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH fence AS (
        SELECT job_id, attempt_id FROM jobs
        WHERE job_id = p_job_id AND attempt_id = p_attempt_id
          AND status = 'running' AND visible_at > clock_timestamp()
        FOR SHARE
    )
    INSERT INTO job_action_results (
        job_id, attempt_id, action_index, name, status, started_at, result, error, error_detail
    )
    SELECT f.job_id, f.attempt_id, p_action_index, p_name, p_status, p_started_at, p_result,
        p_error, p_error_detail
    FROM fence f
    ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
        status = excluded.status, result = excluded.result, error = excluded.error,
        error_detail = excluded.error_detail, finished_at = excluded.finished_at
    RETURNING action_index;
$$;

-- The terminal write by the holder of the fence (succeeded or failed), and the last
-- action's outcome when one is given, in one statement: the outcome is recorded only if
-- the fenced write matched.
CREATE FUNCTION worker_finish(p_job_id uuid, p_attempt_id uuid, p_status text, p_reason text,
    p_error text, p_error_detail text, p_action_index integer, p_action_name text,
    p_action_status text, p_action_started_at timestamptz, p_action_result jsonb,
    p_action_error text, p_action_error_detail text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH written AS (
        UPDATE jobs SET
            status = p_status,
            finished_at = now(),
            retain_until = now() + ttl,
            run_deadline_at = NULL,
            reason = p_reason,
            error = p_error,
            error_detail = p_error_detail
        WHERE job_id = p_job_id AND attempt_id = p_attempt_id
          AND p_status IN ('succeeded', 'failed')
          AND status = 'running' AND visible_at > clock_timestamp()
        RETURNING job_id, status, parent_id
    ), recorded AS (
        INSERT INTO job_action_results (
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
    SELECT job_id, status, parent_id FROM written;
$$;

-- The holder gives the job back — pending after the retry delay while attempts remain,
-- else failed — with the failed action's outcome when given. A retry drops the fence; a
-- terminal failure keeps it (this attempt wrote it).
CREATE FUNCTION worker_release(p_job_id uuid, p_attempt_id uuid, p_base_seconds float8,
    p_cap_seconds float8, p_reason text, p_error text, p_error_detail text,
    p_action_index integer, p_action_name text, p_action_status text,
    p_action_started_at timestamptz, p_action_result jsonb, p_action_error text,
    p_action_error_detail text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH written AS (
        UPDATE jobs j SET
            status = CASE WHEN j.attempt_count >= j.max_attempts THEN 'failed'
                          ELSE 'pending' END,
            attempt_id = CASE WHEN j.attempt_count >= j.max_attempts THEN j.attempt_id END,
            visible_at = now()
                + jobfence_retry_delay(j.attempt_count, p_base_seconds, p_cap_seconds),
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
        INSERT INTO job_action_results (
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
    SELECT job_id, status, parent_id FROM written;
$$;

-- The holder gives the job back after SIGTERM (not the job's fault): pending at once, the
-- attempt not counted — up to p_max_interruptions; past them it counts as a failed
-- attempt, so a job that is always interrupted still ends.
CREATE FUNCTION worker_interrupt(p_job_id uuid, p_attempt_id uuid, p_reason text,
                                 p_max_interruptions integer)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    UPDATE jobs j SET
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
$$;

-- Register output files before uploading them (status running), under the fence.
CREATE FUNCTION worker_register_outputs(p_job_id uuid, p_attempt_id uuid, p_outputs jsonb)
RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH fence AS (
        SELECT job_id, attempt_id FROM jobs
        WHERE job_id = p_job_id AND attempt_id = p_attempt_id
          AND status = 'running' AND visible_at > clock_timestamp()
        FOR SHARE
    )
    INSERT INTO job_outputs (job_id, attempt_id, path, url, status)
    SELECT f.job_id, f.attempt_id, x.path, x.url, 'running'
    FROM fence f, jsonb_to_recordset(p_outputs) AS x (path text, url text)
    ON CONFLICT (job_id, attempt_id, path) DO UPDATE SET
        status = 'running', url = excluded.url, error = NULL, updated_at = clock_timestamp()
    RETURNING path;
$$;

-- Confirm uploaded outputs (done, or error with why), under the fence.
CREATE FUNCTION worker_confirm_outputs(p_job_id uuid, p_attempt_id uuid, p_outputs jsonb)
RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH fence AS (
        SELECT job_id, attempt_id FROM jobs
        WHERE job_id = p_job_id AND attempt_id = p_attempt_id
          AND status = 'running' AND visible_at > clock_timestamp()
        FOR SHARE
    )
    UPDATE job_outputs o SET
        status = x.status, size_bytes = x.size_bytes, error = x.error,
        updated_at = clock_timestamp()
    FROM fence f, jsonb_to_recordset(p_outputs)
        AS x (path text, status text, size_bytes bigint, error text)
    WHERE o.job_id = f.job_id AND o.attempt_id = f.attempt_id AND o.path = x.path
    RETURNING o.path;
$$;

-- Where a job's fence stands for the attempt asking (after a write whose outcome was lost
-- with the connection): its status, whether this attempt holds the fence, and why — never
-- whose the fence is.
CREATE FUNCTION worker_fence(p_job_id uuid, p_attempt_id uuid)
RETURNS TABLE (status text, holds boolean, reason text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT status, attempt_id IS NOT DISTINCT FROM p_attempt_id, reason
    FROM jobs WHERE job_id = p_job_id;
$$;

-- The actions of this job that earlier attempts finished, for the attempt holding the
-- fence (a retry resumes after them).
CREATE FUNCTION worker_done_actions(p_job_id uuid, p_attempt_id uuid)
RETURNS SETOF integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT DISTINCT r.action_index FROM job_action_results r
    WHERE r.job_id = p_job_id AND r.status = 'succeeded'
      AND EXISTS (SELECT FROM jobs j WHERE j.job_id = p_job_id
                  AND j.attempt_id = p_attempt_id AND j.status = 'running');
$$;
