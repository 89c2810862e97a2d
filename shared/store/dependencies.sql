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

-- settle --
-- Settle what waited on jobs that just became terminal, transitively, at most %(budget)s
-- dependents (dependencies.functions.sql: settle_dependents).
SELECT * FROM {schema}.settle_dependents(%(job_ids)s::uuid[], %(budget)s::integer);

-- resolve --
-- Resolve these waiting jobs if their dependencies allow (resolve_waiting: pending, a
-- parent running with its children released, or failed naming the dependency).
SELECT * FROM {schema}.resolve_waiting(%(job_ids)s::uuid[]);

-- waiting_page --
-- Waiting top-level jobs after %(after)s in id order (the safety net re-checks them).
SELECT job_id FROM {schema}.jobs
WHERE status = 'waiting' AND parent_id IS NULL AND job_id > %(after)s
ORDER BY job_id
LIMIT %(limit)s;
