-- `after` dependencies: recording them and releasing (or failing) what waited.
-- Named statements, run by the method of the same name in store/dependencies.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- status --
-- The jobs that new jobs will wait on, with their status: a plain read, never a lock, so
-- that an enqueue never holds up a running dependency's heartbeats.
SELECT job_id, status FROM {schema}.jobs WHERE job_id = ANY(%(job_ids)s::uuid[]);

-- insert_many --
-- Record `after` dependencies of new jobs.
INSERT INTO {schema}.job_dependencies (job_id, depends_on)
SELECT x.job_id, x.depends_on
FROM jsonb_to_recordset(%(deps)s::jsonb) AS x (job_id uuid, depends_on uuid)
ON CONFLICT DO NOTHING;

-- dependents --
-- Up to %(limit)s waiting jobs that depend on any of these jobs: an index probe per job
-- (most jobs have none), then one per dependency row until the limit (a job waiting on two
-- of them may come twice).
SELECT dep.job_id
FROM {schema}.job_dependencies dep
WHERE dep.depends_on = ANY(%(job_ids)s::uuid[])
  AND (SELECT j.status FROM {schema}.jobs j WHERE j.job_id = dep.job_id) = 'waiting'
LIMIT %(limit)s;

-- resolve --
-- Resolve waiting jobs whose dependencies allow it: pending (a parent: running) once every
-- dependency succeeded; failed, naming the dependency, as soon as one failed, was cancelled
-- or is gone. Jobs with a dependency still active stay waiting. Written as index probes per
-- given job and per dependency (LATERAL and a scalar subquery), so that a batch costs the
-- same however many jobs wait in the table: a hash join over the whole table per batch made
-- paging through 100k dependents quadratic.
WITH verdict AS (
    SELECT ids.job_id, v.active, v.failure
    FROM unnest(%(job_ids)s::uuid[]) AS ids (job_id)
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE s.status IN ('waiting', 'pending', 'running')) AS active,
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
)
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
WHERE j.job_id = v.job_id AND j.status = 'waiting' AND (v.failure IS NOT NULL OR v.active = 0)
RETURNING j.job_id, j.status, j.parent_id, j.is_parent;

-- release_children --
-- A parent whose dependencies succeeded: its waiting children become claimable.
UPDATE {schema}.jobs SET status = 'pending',
    visible_at = greatest(now(), coalesce(run_at, now())), reason = 'parent started'
WHERE parent_id = ANY(%(parent_ids)s::uuid[]) AND status = 'waiting'
RETURNING job_id, status, parent_id;

-- cancel_children_of_failed --
-- A parent that failed before starting: its waiting children will never run.
UPDATE {schema}.jobs SET status = 'cancelled', finished_at = now(), retain_until = now() + ttl,
    reason = 'parent failed before starting', error = 'parent failed before starting'
WHERE parent_id = ANY(%(parent_ids)s::uuid[]) AND status = 'waiting'
RETURNING job_id, status, parent_id;

-- waiting_page --
-- Waiting top-level jobs after %(after)s in id order (the safety net re-checks them).
SELECT job_id FROM {schema}.jobs
WHERE status = 'waiting' AND parent_id IS NULL AND job_id > %(after)s
ORDER BY job_id
LIMIT %(limit)s;
