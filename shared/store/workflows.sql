-- Workflows: a graph of named steps submitted at once, each step a job; the row of a
-- submission, its steps, and its cancel and retry marks.
-- Named statements, run by the method of the same name in store/workflows.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- add --
-- A workflow's row, or the first one under its key (created false): operator_workflow_add.
SELECT * FROM {schema}.operator_workflow_add(%(workflow_id)s::uuid, %(name)s::text,
    %(key)s::text, %(spec_hash)s::text, %(steps)s::integer, %(actor)s::text);

-- mark --
-- Mark a workflow cancelled or (its retry) not, recorded: operator_workflow_mark.
SELECT {schema}.operator_workflow_mark(%(workflow_id)s::uuid, %(cancelled)s::boolean,
    %(actor)s::text, %(reason)s::text) AS name;

-- get --
-- One workflow with its state (jobfence_workflow_state).
SELECT w.workflow_id, w.name, w.idempotency_key, w.steps, w.created_by, w.created_at,
    w.cancelled_at, s.status, s.failed_step, s.steps_done, s.steps_failed, s.started_at,
    s.finished_at
FROM {schema}.workflows w
CROSS JOIN LATERAL {schema}.jobfence_workflow_state(w.workflow_id, w.cancelled_at, w.steps) s
WHERE w.workflow_id = %(workflow_id)s;

-- page --
-- Workflows newest first (their ids are time-ordered), optionally by name; with `after`,
-- only those older than that one (the next page: keyset, by the primary key).
SELECT w.workflow_id, w.name, w.idempotency_key, w.steps, w.created_by, w.created_at,
    w.cancelled_at, s.status, s.failed_step, s.steps_done, s.steps_failed, s.started_at,
    s.finished_at
FROM {schema}.workflows w
CROSS JOIN LATERAL {schema}.jobfence_workflow_state(w.workflow_id, w.cancelled_at, w.steps) s
WHERE (%(name)s::text IS NULL OR w.name = %(name)s)
  AND (%(after)s::uuid IS NULL OR w.workflow_id < %(after)s)
ORDER BY w.workflow_id DESC
LIMIT %(limit)s;

-- steps --
-- The steps of these workflows: each one's job and its state, the steps it is after (and
-- the jobs outside the workflow), the steps it takes its inputs from and how many files
-- they handed it (once it became pending); by workflow, in step name order.
SELECT j.workflow_id, j.step, j.job_id, j.status, j.is_parent, j.reason, j.error, j.attempt_count,
    j.created_at, j.started_at, j.finished_at,
    ARRAY(SELECT s FROM jsonb_object_keys(j.inputs -> 'steps') AS s ORDER BY s)
        AS inputs_from,
    coalesce(jsonb_array_length(j.inputs -> 'files'), (j.inputs ->> 'handed')::integer)
        AS inputs_handed,
    ARRAY(SELECT d.step FROM {schema}.job_dependencies dep
          JOIN {schema}.jobs d ON d.job_id = dep.depends_on
          WHERE dep.job_id = j.job_id AND d.workflow_id = j.workflow_id
          ORDER BY d.step) AS after,
    ARRAY(SELECT dep.depends_on FROM {schema}.job_dependencies dep
          WHERE dep.job_id = j.job_id AND NOT EXISTS (
              SELECT FROM {schema}.jobs d WHERE d.job_id = dep.depends_on
                AND d.workflow_id = j.workflow_id)
          ORDER BY dep.depends_on) AS after_jobs
FROM {schema}.jobs j
WHERE j.workflow_id = ANY(%(workflow_ids)s::uuid[])
ORDER BY j.workflow_id, j.step;

-- summary --
-- The workflows submitted in the last day, each with its state: what the metrics count
-- (workflows by status; each name's latest finished one). Index scans of their steps.
SELECT w.workflow_id, w.name, s.status, s.steps_failed,
    extract(epoch FROM s.finished_at - w.created_at)::float8 AS seconds
FROM {schema}.workflows w
CROSS JOIN LATERAL {schema}.jobfence_workflow_state(w.workflow_id, w.cancelled_at, w.steps) s
WHERE w.created_at > now() - interval '1 day'
ORDER BY w.workflow_id DESC;
