-- Database functions of the life of one claim: the claim itself and every write fenced by
-- its attempt_id, the worker role's verbs (store/attempts.py runs them through
-- attempts.sql). Each checks the fence inside the database and matches nothing unless the
-- attempt it names holds a live lease.
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- Claim up to p_limit ready jobs of a queue in one statement: fresh fence, lease,
-- attempt_count + 1 (SKIP LOCKED; nothing while draining or the queue is paused; a
-- queue's limit on running jobs, its rate, its limit on each group's running jobs and its
-- round-robin across groups, held by a transaction lock taken here).
-- p_claim_id names the claim (a fresh uuid per statement, the worker's own): a claim whose
-- answer was lost is given back by it (worker_release_claim).
CREATE OR REPLACE FUNCTION {schema}.worker_claim(p_queue text, p_worker_id text,
                                                p_lease_seconds float8, p_limit integer,
                                                p_claim_id uuid)
RETURNS TABLE (job_id uuid, attempt_id uuid, attempt_count integer, max_attempts integer,
               actions jsonb, inputs jsonb, parent_id uuid, lease_expires_at timestamptz,
               run_deadline_at timestamptz, interruptions integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    settings record;
    room integer := p_limit;
    picked uuid[];
BEGIN
    PERFORM {schema}.jobfence_check_bounds('lease_seconds', p_lease_seconds, 0.001, 86400);
    PERFORM {schema}.jobfence_check_bounds('limit', p_limit, 1, 1000);
    SELECT q.max_running, q.rate_limit, q.rate_period, q.group_limit, q.fair, q.paused
    INTO settings FROM {schema}.queues q WHERE q.name = p_queue;
    IF settings.max_running IS NOT NULL OR settings.rate_limit IS NOT NULL
       OR settings.group_limit IS NOT NULL OR settings.fair THEN
        PERFORM pg_advisory_xact_lock(27238, hashtext(current_schema() || ':queue:' || p_queue));
        -- Read again under the lock: a rate set meanwhile counts from now on.
        SELECT q.max_running, q.rate_limit, q.rate_period, q.group_limit, q.fair, q.paused
        INTO settings FROM {schema}.queues q WHERE q.name = p_queue;
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
    IF settings.group_limit IS NOT NULL OR settings.fair THEN
        IF settings.paused OR (SELECT k.draining FROM {schema}.jobfence_control k) THEN
            RETURN;
        END IF;
        picked := {schema}.jobfence_pick_groups(p_queue, room, settings.group_limit,
                                                settings.fair);
        IF cardinality(picked) = 0 THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    WITH candidate AS (
        SELECT c.job_id FROM {schema}.jobs c
        WHERE picked IS NULL
          AND c.status = 'pending' AND c.queue = p_queue AND c.visible_at <= now()
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
            claim_id = p_claim_id,
            claimed_at = CASE WHEN settings.rate_limit IS NULL THEN now()
                              ELSE clock_timestamp() END,
            heartbeat_at = now(),
            visible_at = now() + make_interval(secs => p_lease_seconds),
            run_deadline_at = now() + j.timeout,
            started_at = coalesce(j.started_at, now()),
            reason = 'claimed by ' || p_worker_id
        WHERE j.job_id = ANY(coalesce(picked, ARRAY(SELECT c.job_id FROM candidate c)))
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

-- The ready jobs a claim of a queue with groups takes (at most p_room of them, locked):
-- each group at most its limit's room (p_group_limit less its running jobs and attempts
-- still stopping; the jobs without a group are one group, ''), and in turn:
-- * fair: round-robin, one job of each group at a time (its next in priority order), from
--   the group after the one the last fair claim served (queues.fair_cursor, moved here),
--   round again while a round gave any — one probe of jobs_ready_group a job taken (each
--   finds the next group's next job), and one a group at its limit passed;
-- * not fair: the queue's order (priority, then readiness) across every group with room —
--   its first ready jobs looked at in that order (a few times the claim's size); only
--   when those leave the claim short (a group at its limit holds the front of the queue)
--   each group with ready work is looked at (two probes a group).
-- Run only by worker_claim, under the queue's lock: no claim of the queue runs beside it.
CREATE OR REPLACE FUNCTION {schema}.jobfence_pick_groups(
    p_queue text, p_room integer, p_group_limit integer, p_fair boolean)
RETURNS uuid[]
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
DECLARE
    picked uuid[] := '{{}}';
    job uuid;
    g text;
    found text;
    served text;
    whole boolean;
    gave boolean := false;
    seen text[] := '{{}}';  -- the groups met, and each one's room left
    rooms integer[] := '{{}}';
    i integer;
    n bigint;
    looked integer := 0;
    -- Whether any attempt of the queue is still stopping (each holds its group a slot).
    any_stopping boolean := p_group_limit IS NOT NULL AND EXISTS (
        SELECT FROM {schema}.jobs s
        WHERE s.stopping_attempt_id IS NOT NULL AND s.queue = p_queue
          AND s.stopping_until > clock_timestamp());
BEGIN
    IF NOT p_fair THEN
        -- Most claims: the queue's first ready jobs in its order, past the groups with no
        -- room; when those fill the claim, or are all the ready jobs there are, that is it.
        FOR job, g IN
            SELECT j.job_id, coalesce(j.group_key, '') FROM {schema}.jobs j
            WHERE j.status = 'pending' AND j.queue = p_queue AND j.visible_at <= now()
              AND j.stopping_attempt_id IS NULL
            ORDER BY j.priority DESC, j.visible_at
            LIMIT p_room * 4 + 16
        LOOP
            looked := looked + 1;
            i := array_position(seen, g);
            IF i IS NULL THEN
                SELECT count(*) INTO n FROM {schema}.jobs r
                WHERE r.status = 'running' AND r.queue = p_queue AND NOT r.is_parent
                  AND coalesce(r.group_key, '') = g;
                IF any_stopping THEN
                    SELECT n + count(*) INTO n FROM {schema}.jobs s
                    WHERE s.stopping_attempt_id IS NOT NULL AND s.queue = p_queue
                      AND coalesce(s.group_key, '') = g AND s.stopping_until > clock_timestamp();
                END IF;
                seen := seen || g;
                rooms := rooms || (coalesce(p_group_limit, p_room) - n)::integer;
                i := cardinality(seen);
            END IF;
            CONTINUE WHEN rooms[i] <= 0;
            rooms[i] := rooms[i] - 1;
            picked := picked || job;
            EXIT WHEN cardinality(picked) >= p_room;
        END LOOP;
        -- Else (a group at its limit holds the front of the queue): every group with
        -- ready work, its first jobs as far as its room goes, in the queue's order.
        IF cardinality(picked) < p_room AND looked >= p_room * 4 + 16 THEN
            picked := ARRAY(
                WITH RECURSIVE groups (g) AS (
                    (SELECT coalesce(j.group_key, '') FROM {schema}.jobs j
                     WHERE j.status = 'pending' AND j.queue = p_queue
                     ORDER BY coalesce(j.group_key, '') LIMIT 1)
                    UNION ALL
                    SELECT (SELECT coalesce(j.group_key, '') FROM {schema}.jobs j
                            WHERE j.status = 'pending' AND j.queue = p_queue
                              AND coalesce(j.group_key, '') > s.g
                            ORDER BY coalesce(j.group_key, '') LIMIT 1)
                    FROM groups s WHERE s.g IS NOT NULL
                ), running AS (
                    SELECT coalesce(r.group_key, '') AS g, count(*) AS n FROM {schema}.jobs r
                    WHERE r.status = 'running' AND r.queue = p_queue AND NOT r.is_parent
                    GROUP BY 1
                ), stopping AS (
                    SELECT coalesce(r.group_key, '') AS g, count(*) AS n FROM {schema}.jobs r
                    WHERE r.stopping_attempt_id IS NOT NULL AND r.queue = p_queue
                      AND r.stopping_until > clock_timestamp()
                    GROUP BY 1
                )
                SELECT c.job_id FROM groups s
                LEFT JOIN running r ON r.g = s.g
                LEFT JOIN stopping t ON t.g = s.g
                CROSS JOIN LATERAL (
                    SELECT j.job_id, j.priority, j.visible_at FROM {schema}.jobs j
                    WHERE j.status = 'pending' AND j.queue = p_queue
                      AND coalesce(j.group_key, '') = s.g
                      AND j.visible_at <= now() AND j.stopping_attempt_id IS NULL
                    ORDER BY j.priority DESC, j.visible_at
                    LIMIT least(p_room, greatest(0, coalesce(p_group_limit, p_room)
                                                    - coalesce(r.n, 0) - coalesce(t.n, 0)))
                ) c
                WHERE s.g IS NOT NULL
                ORDER BY c.priority DESC, c.visible_at
                LIMIT p_room);
        END IF;
        -- Locked now; one another verb holds is left for the next claim.
        RETURN ARRAY(SELECT j.job_id FROM {schema}.jobs j
                     WHERE j.job_id = ANY(picked) AND j.status = 'pending'
                     FOR UPDATE SKIP LOCKED);
    END IF;
    SELECT q.fair_cursor INTO g FROM {schema}.queues q WHERE q.name = p_queue;
    whole := g IS NULL;  -- this round began at the first group
    LOOP
        -- The next group's next ready job after group g (from the first group when NULL).
        job := NULL;
        IF g IS NULL THEN
            SELECT j.job_id, coalesce(j.group_key, '') INTO job, found FROM {schema}.jobs j
            WHERE j.status = 'pending' AND j.queue = p_queue
              AND j.visible_at <= now() AND j.stopping_attempt_id IS NULL
              AND j.job_id <> ALL(picked)
            ORDER BY coalesce(j.group_key, ''), j.priority DESC, j.visible_at
            LIMIT 1 FOR UPDATE SKIP LOCKED;
        ELSE
            SELECT j.job_id, coalesce(j.group_key, '') INTO job, found FROM {schema}.jobs j
            WHERE j.status = 'pending' AND j.queue = p_queue
              AND coalesce(j.group_key, '') > g
              AND j.visible_at <= now() AND j.stopping_attempt_id IS NULL
              AND j.job_id <> ALL(picked)
            ORDER BY coalesce(j.group_key, ''), j.priority DESC, j.visible_at
            LIMIT 1 FOR UPDATE SKIP LOCKED;
        END IF;
        IF job IS NULL THEN  -- past the last group
            EXIT WHEN g IS NULL OR (whole AND NOT gave);  -- a whole round gave nothing
            g := NULL;
            whole := true;
            gave := false;
            CONTINUE;
        END IF;
        g := found;
        IF p_group_limit IS NOT NULL THEN
            i := array_position(seen, g);
            IF i IS NULL THEN
                -- The group's running jobs and attempts still stopping, once a claim. (The
                -- same count as above, written out: as a function of its own it made a
                -- claim of ten under a group limit 1.8x slower, bench/ history section.)
                SELECT count(*) INTO n FROM {schema}.jobs r
                WHERE r.status = 'running' AND r.queue = p_queue AND NOT r.is_parent
                  AND coalesce(r.group_key, '') = g;
                IF any_stopping THEN
                    SELECT n + count(*) INTO n FROM {schema}.jobs s
                    WHERE s.stopping_attempt_id IS NOT NULL AND s.queue = p_queue
                      AND coalesce(s.group_key, '') = g AND s.stopping_until > clock_timestamp();
                END IF;
                seen := seen || g;
                rooms := rooms || (p_group_limit - n)::integer;
                i := cardinality(seen);
            END IF;
            -- A group at its limit: its job is left locked until the claim commits (no
            -- other claim of the queue runs meanwhile).
            CONTINUE WHEN rooms[i] <= 0;
            rooms[i] := rooms[i] - 1;
        END IF;
        picked := picked || job;
        served := g;
        gave := true;
        EXIT WHEN cardinality(picked) >= p_room;
    END LOOP;
    IF served IS NOT NULL THEN
        UPDATE {schema}.queues q SET fair_cursor = served WHERE q.name = p_queue;
    END IF;
    RETURN picked;
END;
$$;

-- How long until the next job of a queue that is not ready yet becomes ready (seconds from
-- now; NULL when none is scheduled): a worker whose claim found nothing, while its other
-- slots run, sleeps until then rather than until its next look (worker/loop.py). Walks the
-- claim's own index (jobs_ready_queue) a priority at a time: two probes per distinct
-- priority of the queue's pending jobs, at most 64 of them — past those, the worker's look
-- finds the rest. No fence: it says when, never which job.
CREATE OR REPLACE FUNCTION {schema}.worker_next_due(p_queue text) RETURNS float8
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp
SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    -- Planned for this queue each time (a generic plan walks every queue's pending jobs).
    RETURN (
        WITH RECURSIVE priorities (priority, n) AS (
            (SELECT j.priority, 1 FROM {schema}.jobs j
             WHERE j.status = 'pending' AND j.queue = p_queue
             ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM {schema}.jobs j
                    WHERE j.status = 'pending' AND j.queue = p_queue
                      AND j.priority < p.priority
                    ORDER BY j.priority DESC LIMIT 1), p.n + 1
            FROM priorities p WHERE p.priority IS NOT NULL AND p.n < 64
        )
        SELECT greatest(0, extract(epoch FROM s.due - now()))::float8
        FROM (SELECT min((SELECT j.visible_at FROM {schema}.jobs j
                          WHERE j.status = 'pending' AND j.queue = p_queue
                            AND j.priority = p.priority AND j.visible_at > now()
                          ORDER BY j.visible_at LIMIT 1)) AS due
              FROM priorities p WHERE p.priority IS NOT NULL) s
        WHERE s.due IS NOT NULL);
END
$$;

-- The claim of a worker of the previous release, which names no claim.
CREATE OR REPLACE FUNCTION {schema}.worker_claim(p_queue text, p_worker_id text,
                                                p_lease_seconds float8, p_limit integer)
RETURNS TABLE (job_id uuid, attempt_id uuid, attempt_count integer, max_attempts integer,
               actions jsonb, inputs jsonb, parent_id uuid, lease_expires_at timestamptz,
               run_deadline_at timestamptz, interruptions integer)
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.worker_claim(p_queue, p_worker_id, p_lease_seconds, p_limit,
                                        NULL::uuid);
$$;

-- A claim whose answer was lost with its connection (it may or may not have committed):
-- give back the jobs it took, and only those — matched on the claim's id and its claimer,
-- still running under that claim's lease — pending at once, their attempts not spent
-- (nothing ran). Nothing when the claim had not committed. Waits for the claim's own
-- transaction when it is still committing (its rows are locked until then).
CREATE OR REPLACE FUNCTION {schema}.worker_release_claim(p_claim_id uuid, p_worker_id text,
                                                        p_reason text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        status = 'pending',
        attempt_count = j.attempt_count - 1,
        attempt_id = NULL,
        claim_id = NULL,
        visible_at = now(),
        claimed_by = NULL,
        run_deadline_at = NULL,
        reason = p_reason
    WHERE j.claimed_by = p_worker_id AND j.claim_id = p_claim_id
      AND j.status = 'running' AND NOT j.is_parent
      AND j.visible_at > clock_timestamp()
    RETURNING j.job_id, j.status, j.parent_id;
END;
$$;

-- Renew the lease of a live attempt; NULL when the fence is lost (cancelled, reclaimed,
-- timed out, or the lease already ran out).
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

-- Renew the leases of these attempts, each matched on its own fence; the ones renewed.
CREATE OR REPLACE FUNCTION {schema}.worker_heartbeat_many(
    p_job_ids uuid[], p_attempt_ids uuid[], p_lease_seconds float8)
RETURNS TABLE (job_id uuid, lease_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.jobfence_check_bounds('lease_seconds', p_lease_seconds, 0.001, 86400);
    PERFORM {schema}.jobfence_check_batch('heartbeat', cardinality(p_job_ids));
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        visible_at = now() + make_interval(secs => p_lease_seconds),
        heartbeat_at = now()
    FROM unnest(p_job_ids, p_attempt_ids) AS a (job_id, attempt_id)
    WHERE j.job_id = a.job_id AND j.attempt_id = a.attempt_id
      AND j.status = 'running' AND j.visible_at > clock_timestamp()
    RETURNING j.job_id, j.visible_at;
END;
$$;

-- Which of the given attempts still hold their job's fence with a live lease: the
-- worker's cheap look, every fraction of a second, for a cancel it was not told of.
CREATE OR REPLACE FUNCTION {schema}.worker_holding(p_job_ids uuid[], p_attempt_ids uuid[])
RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT j.job_id
    FROM unnest(p_job_ids[1:1000], p_attempt_ids[1:1000]) AS a (job_id, attempt_id)
    JOIN {schema}.jobs j ON j.job_id = a.job_id AND j.attempt_id = a.attempt_id
    WHERE j.status = 'running' AND j.visible_at > clock_timestamp();
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

-- The actions the job's current run finished (for the attempt holding the fence).
CREATE OR REPLACE FUNCTION {schema}.worker_done_actions(p_job_id uuid, p_attempt_id uuid)
RETURNS SETOF integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT DISTINCT r.action_index
    FROM {schema}.jobs j JOIN {schema}.job_action_results r ON r.job_id = j.job_id
    WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id AND j.status = 'running'
      AND r.status = 'succeeded' AND r.run = j.run;
$$;

-- Record one action's result under the fence (idempotent: a write retried after a dropped
-- connection is harmless). The verbs a worker calls for every job or action are PL/pgSQL,
-- whose plans are cached (worker_finish says why).
CREATE OR REPLACE FUNCTION {schema}.worker_record_action(p_job_id uuid, p_attempt_id uuid,
    p_action_index integer, p_name text, p_status text, p_started_at timestamptz,
    p_result jsonb, p_error text, p_error_detail text)
RETURNS SETOF integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    RETURN QUERY
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
END
$$;

-- Register the outputs the attempt is about to upload (fenced), running until confirmed.
CREATE OR REPLACE FUNCTION {schema}.worker_register_outputs(
    p_job_id uuid, p_attempt_id uuid, p_outputs jsonb)
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

-- Mark the outputs the attempt uploaded as done (fenced).
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

-- Register one action's output streams before they go to the object store (fenced); the
-- action index back, NULL when the fence is lost.
CREATE OR REPLACE FUNCTION {schema}.worker_register_log(p_job_id uuid, p_attempt_id uuid,
                                                        p_action_index integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    registered integer;
BEGIN
    WITH fence AS (
        SELECT j.job_id, j.attempt_id FROM {schema}.jobs j
        WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
          AND j.status = 'running' AND j.visible_at > clock_timestamp()
          AND p_action_index BETWEEN 0 AND jsonb_array_length(j.actions) - 1
        FOR SHARE
    ), made AS (
        INSERT INTO {schema}.job_logs AS l (job_id, attempt_id, action_index)
        SELECT f.job_id, f.attempt_id, p_action_index FROM fence f
        ON CONFLICT DO NOTHING
        RETURNING l.action_index
    )
    SELECT p_action_index INTO registered FROM fence;
    RETURN registered;
END
$$;

-- The terminal write by the holder of the fence (succeeded or failed), with its last
-- action's result, in one statement; no row back means the fence was lost. PL/pgSQL for
-- its cached plan: a SQL function that is not inlined (a definer never is) plans its
-- statement at every call, which cost the single terminal write ~0.4 ms.
CREATE OR REPLACE FUNCTION {schema}.worker_finish(p_job_id uuid, p_attempt_id uuid,
    p_status text, p_reason text, p_error text, p_error_detail text,
    p_action_index integer, p_action_name text, p_action_status text,
    p_action_started_at timestamptz, p_action_result jsonb, p_action_error text,
    p_action_error_detail text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
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
END
$$;

-- The terminal writes (succeeded or failed) of attempts that finished, each with its last
-- action's outcome when it has one, each matched on its own fence and a live lease; the
-- jobs written. A row given twice counts once.
CREATE OR REPLACE FUNCTION {schema}.worker_finish_many(p_rows jsonb)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF jsonb_typeof(p_rows) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'the terminal writes must be a JSON array';
    END IF;
    PERFORM {schema}.jobfence_check_batch('finish', jsonb_array_length(p_rows));
    RETURN QUERY
    WITH given AS (
        SELECT DISTINCT ON (x.job_id) x.*
        FROM jsonb_to_recordset(p_rows) AS x (
            job_id uuid, attempt_id uuid, status text, reason text, error text,
            error_detail text, action_index integer, action_name text, action_status text,
            action_started_at timestamptz, action_result jsonb, action_error text,
            action_error_detail text)
        WHERE x.job_id IS NOT NULL AND x.attempt_id IS NOT NULL
          AND x.status IN ('succeeded', 'failed')
        ORDER BY x.job_id
    ), written AS (
        UPDATE {schema}.jobs j SET
            status = g.status,
            finished_at = now(),
            retain_until = now() + j.ttl,
            run_deadline_at = NULL,
            reason = coalesce(g.reason, g.status),
            error = g.error,
            error_detail = g.error_detail
        FROM given g
        WHERE j.job_id = g.job_id AND j.attempt_id = g.attempt_id
          AND j.status = 'running' AND j.visible_at > clock_timestamp()
        RETURNING j.job_id, j.status, j.parent_id
    ), recorded AS (
        INSERT INTO {schema}.job_action_results (
            job_id, attempt_id, action_index, name, status, started_at, result, error,
            error_detail
        )
        SELECT g.job_id, g.attempt_id, g.action_index, g.action_name, g.action_status,
            g.action_started_at, g.action_result, g.action_error, g.action_error_detail
        FROM written w JOIN given g ON g.job_id = w.job_id
        WHERE g.action_index IS NOT NULL
        ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
            status = excluded.status, result = excluded.result, error = excluded.error,
            error_detail = excluded.error_detail, finished_at = excluded.finished_at
    )
    SELECT w.job_id, w.status, w.parent_id FROM written w;
END;
$$;

-- A failed attempt with attempts left: back to pending after the retry delay (failed once
-- they are exhausted), with its last action's result, under the fence.
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

-- The action asked to run again later: pending after p_delay_seconds, the attempt not
-- counted, failed once the job snoozed p_max_snoozes times (fenced).
CREATE OR REPLACE FUNCTION {schema}.worker_snooze(p_job_id uuid, p_attempt_id uuid,
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

-- The snooze with the snoozing action's result written in the same statement (its output
-- is kept for the run's next attempt).
CREATE OR REPLACE FUNCTION {schema}.worker_snooze(p_job_id uuid, p_attempt_id uuid,
    p_delay_seconds float8, p_reason text, p_max_snoozes integer,
    p_action_index integer, p_action_name text, p_action_status text,
    p_action_started_at timestamptz, p_action_result jsonb, p_action_error text,
    p_action_error_detail text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF p_action_index IS NOT NULL AND p_action_status IS DISTINCT FROM 'snoozed' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'a snoozing action''s outcome is recorded as snoozed';
    END IF;
    -- Under the fence (the same rows worker_snooze then matches, locked first).
    INSERT INTO {schema}.job_action_results AS r (
        job_id, attempt_id, action_index, name, status, started_at, result, error,
        error_detail)
    SELECT j.job_id, j.attempt_id, p_action_index, p_action_name, 'snoozed',
        p_action_started_at, p_action_result, p_action_error, p_action_error_detail
    FROM {schema}.jobs j
    WHERE p_action_index IS NOT NULL AND j.job_id = p_job_id
      AND j.attempt_id = p_attempt_id AND j.status = 'running'
      AND j.visible_at > clock_timestamp()
    ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
        status = excluded.status, result = excluded.result, error = excluded.error,
        error_detail = excluded.error_detail, finished_at = excluded.finished_at;
    RETURN QUERY
    SELECT * FROM {schema}.worker_snooze(p_job_id, p_attempt_id, p_delay_seconds, p_reason,
                                         p_max_snoozes);
END;
$$;

-- Give running attempts' jobs back (their worker was told to stop, e.g. SIGTERM), each
-- matched on its own fence: pending now, the attempt not counted while the job was
-- interrupted fewer than p_max_interruptions times; after that it counts, and the job
-- fails once its attempts are exhausted.
CREATE OR REPLACE FUNCTION {schema}.worker_interrupt_many(
    p_job_ids uuid[], p_attempt_ids uuid[], p_reason text, p_max_interruptions integer)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.jobfence_check_bounds('max_interruptions', p_max_interruptions, 0,
                                          1000000);
    PERFORM {schema}.jobfence_check_batch('interrupt', cardinality(p_job_ids));
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
    FROM unnest(p_job_ids, p_attempt_ids) AS a (job_id, attempt_id)
    WHERE j.job_id = a.job_id AND j.attempt_id = a.attempt_id
      AND j.status = 'running' AND j.visible_at > clock_timestamp()
    RETURNING j.job_id, j.status, j.parent_id;
END;
$$;

-- One attempt given back (a worker with one job in hand): a batch of one, by the same rules.
CREATE OR REPLACE FUNCTION {schema}.worker_interrupt(p_job_id uuid, p_attempt_id uuid,
                                                    p_reason text,
                                                    p_max_interruptions integer)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.worker_interrupt_many(ARRAY[p_job_id], ARRAY[p_attempt_id],
                                                 p_reason, p_max_interruptions);
$$;

-- The attempt whose fence was rotated confirms that its command is gone: its job's
-- resource is free, and the job may be claimed again.
CREATE OR REPLACE FUNCTION {schema}.worker_stopped(p_job_id uuid, p_attempt_id uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    UPDATE {schema}.jobs j SET stopping_attempt_id = NULL, stopping_until = NULL
    WHERE j.job_id = p_job_id AND j.stopping_attempt_id = p_attempt_id;
    RETURN FOUND;
END;
$$;
