-- Database functions settling what waited on other jobs (store/dependencies.py runs them
-- through dependencies.sql).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- The files a workflow step takes from the steps before it (its inputs' `steps`, each name
-- with its job id; each must be a step of p_workflow_id), once they have all succeeded:
-- each one's committed outputs (jobfence_committed_outputs) — a fan-out step's, its
-- datums' — named STEP/PATH (STEP/DATUM/PATH where two datums wrote one
-- name; where a run's attempts wrote one name, the newest). Its inputs back with `files`
-- added, or a failure when there are more than p_most of them, two would share a name, or
-- a step that fans out over them (`per_datum`) would have none.
CREATE OR REPLACE FUNCTION {schema}.jobfence_step_inputs(p_workflow_id uuid, p_inputs jsonb,
                                                         p_most integer)
RETURNS TABLE (inputs jsonb, failure text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    WITH named AS (
        SELECT s.value::uuid AS job_id FROM jsonb_each_text(p_inputs -> 'steps') AS s
    ), given AS (  -- only steps of its own workflow (a row written by hand names no other)
        SELECT j.step, j.job_id FROM named n JOIN {schema}.jobs j ON j.job_id = n.job_id
        WHERE j.workflow_id = p_workflow_id AND j.step IS NOT NULL
    ), producers AS (
        SELECT g.step, j.job_id, j.attempt_id, j.run
        FROM given g JOIN {schema}.jobs j ON j.job_id = g.job_id
        WHERE NOT j.is_parent AND j.status = 'succeeded'
        UNION ALL
        SELECT g.step, c.job_id, c.attempt_id, c.run
        FROM given g JOIN {schema}.jobs c ON c.parent_id = g.job_id
        WHERE c.status = 'succeeded'
    ), files AS (
        SELECT DISTINCT ON (p.step, p.job_id, o.path) p.step, p.job_id, o.path, o.url
        FROM producers p
        CROSS JOIN LATERAL {schema}.jobfence_committed_outputs(p.job_id, p.attempt_id,
                                                               p.run) o
        ORDER BY p.step, p.job_id, o.path, o.created_at DESC
    ), handed AS (
        SELECT f.url, f.step || '/' || CASE
            WHEN count(*) OVER (PARTITION BY f.step, f.path) > 1 THEN f.job_id || '/'
            ELSE '' END || f.path AS name
        FROM files f
    ), strays AS (
        SELECT min(n.job_id::text) AS job_id FROM named n
        WHERE NOT EXISTS (SELECT FROM given g WHERE g.job_id = n.job_id)
    )
    SELECT CASE WHEN count(*) <= p_most AND count(DISTINCT n.name) = count(*)
                    AND (count(*) > 0 OR NOT p_inputs ? 'per_datum')
                    AND (SELECT x.job_id FROM strays x) IS NULL
               THEN p_inputs || jsonb_build_object('files',
                   coalesce(jsonb_agg(jsonb_build_object('name', n.name, 'url', n.url)
                                      ORDER BY n.name), '[]'::jsonb)) END,
           CASE WHEN (SELECT x.job_id FROM strays x) IS NOT NULL THEN format(
               'its inputs name job %s, which is not a step of its workflow',
               (SELECT x.job_id FROM strays x))
           WHEN count(*) > p_most THEN format(
               'the steps before it left %s files, more than the %s a step takes as inputs',
               count(*), p_most)
           WHEN count(*) = 0 AND p_inputs ? 'per_datum' THEN
               'the steps before it left no files to fan out over'
           WHEN count(DISTINCT n.name) < count(*) THEN format(
               'two files of the steps before it would both be %s in its inputs (a datum '
               'wrote a name under another datum''s id)', (
                   SELECT d.name FROM handed d GROUP BY d.name HAVING count(*) > 1
                   ORDER BY d.name LIMIT 1)) END
    FROM handed n;
$$;

-- A new job id as the clients make them (jobfence.ids.uuid7): the milliseconds since the
-- epoch in its first 48 bits, version 7, random after.
CREATE OR REPLACE FUNCTION {schema}.jobfence_uuid7() RETURNS uuid
LANGUAGE sql VOLATILE SET search_path = {schema}, pg_temp AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                          FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid;
$$;

-- The datums of a workflow step that fans out over the files of the steps before it (its
-- inputs' `per_datum` of them each, in name order), made when it starts running — once:
-- a step opened again by a retry keeps the datums it has. Each as a datum of an S3 prefix
-- is made (submit.py, datums.py): the parent's actions, limits, labels, queue and group.
CREATE OR REPLACE FUNCTION {schema}.jobfence_fan_out(p_parent_id uuid, p_files jsonb)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SET search_path = {schema}, pg_temp AS $$
    INSERT INTO {schema}.jobs AS c (
        job_id, status, actions, resource, priority, max_attempts, visible_at, parent_id,
        is_parent, inputs, labels, timeout, reason, queue, run_at, traceparent, group_key)
    SELECT {schema}.jobfence_uuid7(), 'pending', p.actions, NULL, p.priority,
        p.max_attempts, greatest(now(), coalesce(p.run_at, now())), p.job_id, false,
        jsonb_build_object('files', d.files), p.labels, p.timeout, 'parent started',
        p.queue, p.run_at, p.traceparent, p.group_key
    FROM {schema}.jobs p
    CROSS JOIN LATERAL (
        SELECT jsonb_agg(f.value ORDER BY f.n) AS files
        FROM jsonb_array_elements(p_files) WITH ORDINALITY AS f (value, n)
        GROUP BY (f.n - 1) / greatest(coalesce((p.inputs ->> 'per_datum')::integer, 1), 1)
    ) d
    WHERE p.job_id = p_parent_id AND p.is_parent AND p.status = 'running'
      AND NOT EXISTS (SELECT FROM {schema}.jobs k WHERE k.parent_id = p.job_id)
    RETURNING c.job_id, c.status, c.parent_id;
$$;

-- Settle waiting jobs whose dependencies are all decided: pending once they all
-- succeeded, failed (naming the dependency, and its step in a workflow) when one failed,
-- was cancelled or is gone. A workflow step taking files from the steps before it gets
-- them now, when it becomes pending (again after a retry: the files of the runs that won);
-- one that fans out over them, its datums (jobfence_fan_out; the parent keeps the count).
-- Run after an enqueue's commit, so that a dependency finishing meanwhile is seen by one
-- side or the other.
CREATE OR REPLACE FUNCTION {schema}.resolve_waiting(p_job_ids uuid[])
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    started uuid[] := '{{}}';
    failed uuid[] := '{{}}';
    fanned uuid[] := '{{}}';
    fanned_files jsonb[] := '{{}}';
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
                        THEN 'dependency ' || dep.depends_on
                             || coalesce(' (step ' || s.step || ')', '') || ' ' || s.status
                END) AS failure,
                count(*) AS deps
            FROM {schema}.job_dependencies dep
            LEFT JOIN LATERAL (SELECT d.status, d.step FROM {schema}.jobs d
                               WHERE d.job_id = dep.depends_on) s ON true
            WHERE dep.job_id = ids.job_id
        ) v
        WHERE v.deps > 0
    ), handed AS (
        SELECT v.job_id, v.active, coalesce(v.failure, h.failure) AS failure, h.inputs
        FROM verdict v
        LEFT JOIN LATERAL (  -- the files only of a step about to become pending
            SELECT s.inputs, s.failure FROM {schema}.jobs w
            CROSS JOIN LATERAL {schema}.jobfence_step_inputs(w.workflow_id, w.inputs,
                                                             10000) s
            WHERE w.job_id = v.job_id AND v.failure IS NULL AND v.active = 0
              AND w.status = 'waiting' AND w.inputs ? 'steps'
        ) h ON true
    ), written AS (
        UPDATE {schema}.jobs j SET
            status = CASE WHEN v.failure IS NOT NULL THEN 'failed'
                          WHEN j.is_parent THEN 'running' ELSE 'pending' END,
            inputs = CASE WHEN v.inputs IS NULL THEN j.inputs
                          WHEN j.is_parent THEN j.inputs || jsonb_build_object(
                              'handed', jsonb_array_length(v.inputs -> 'files'))
                          ELSE v.inputs END,
            visible_at = greatest(now(), coalesce(j.run_at, now())),
            finished_at = CASE WHEN v.failure IS NOT NULL THEN now() END,
            retain_until = CASE WHEN v.failure IS NOT NULL THEN now() + j.ttl END,
            started_at = CASE WHEN v.failure IS NULL AND j.is_parent THEN now() END,
            reason = coalesce(v.failure, 'dependencies succeeded'),
            error = v.failure
        FROM handed v
        WHERE j.job_id = v.job_id AND j.status = 'waiting'
          AND (v.failure IS NOT NULL OR v.active = 0)
        RETURNING j.job_id, j.status, j.parent_id, j.is_parent, v.inputs AS handed
    ) SELECT * FROM written
    LOOP
        job_id := made.job_id; status := made.status; parent_id := made.parent_id;
        RETURN NEXT;
        IF made.is_parent AND made.status = 'running' THEN
            started := started || made.job_id;
            IF made.handed IS NOT NULL THEN
                fanned := fanned || made.job_id;
                fanned_files := fanned_files || (made.handed -> 'files');
            END IF;
        ELSIF made.is_parent AND made.status = 'failed' THEN
            failed := failed || made.job_id;
        END IF;
    END LOOP;
    RETURN QUERY
    SELECT f.* FROM unnest(fanned, fanned_files) AS x (parent, files)
    CROSS JOIN LATERAL {schema}.jobfence_fan_out(x.parent, x.files) f;
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

-- Settle what waited on jobs that just became terminal, up to a budget of jobs, walking
-- dependents of dependents (the rest is left to export-finalize's safety net). Run after
-- every terminal write: when nothing depends on these jobs (most of the time) one index
-- probe says so and nothing else runs.
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
    IF NOT EXISTS (SELECT FROM {schema}.job_dependencies dep
                   WHERE dep.depends_on = ANY(frontier)) THEN
        RETURN;
    END IF;
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
