-- 0043: workflows — a graph of named steps submitted at once, each step a job.
--
-- * workflows: one row a submission: its name, its key (a repeated submission with the same
--   key and spec is answered with the first; another spec under it is refused), how many
--   steps, who submitted it, and when it was cancelled (NULL unless it was, or once it is
--   retried). Its status is derived from its steps' jobs, never stored.
-- * jobs.workflow_id, jobs.step: the workflow and the step a job is (NULL for other jobs,
--   and for a fan-out step's datums, which belong to their parent); a step's `after` on other
--   steps is job_dependencies, as any job's.
-- Building the index reads the whole table; on a large one, upgrade with drain on.
CREATE TABLE {schema}.workflows (
    workflow_id     uuid PRIMARY KEY,
    name            text NOT NULL
        CONSTRAINT workflows_name CHECK (name ~ '^[A-Za-z0-9]([-A-Za-z0-9_.]{{0,126}}[A-Za-z0-9])?$'),
    idempotency_key text CONSTRAINT workflows_key CHECK (length(idempotency_key) BETWEEN 1 AND 500),
    spec_hash       text NOT NULL,
    steps           integer NOT NULL CONSTRAINT workflows_steps CHECK (steps BETWEEN 1 AND 1000),
    created_by      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    cancelled_at    timestamptz
);
CREATE UNIQUE INDEX workflows_idempotency_key ON {schema}.workflows (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

ALTER TABLE {schema}.jobs
    ADD COLUMN workflow_id uuid REFERENCES {schema}.workflows (workflow_id),
    ADD COLUMN step text CONSTRAINT jobs_step CHECK (step ~ '^[a-z0-9]([-a-z0-9_]{{0,61}}[a-z0-9])?$'),
    ADD CONSTRAINT jobs_step_of_a_workflow CHECK ((workflow_id IS NULL) = (step IS NULL));
CREATE UNIQUE INDEX jobs_workflow_step ON {schema}.jobs (workflow_id, step)
    WHERE workflow_id IS NOT NULL;
CREATE INDEX workflows_created ON {schema}.workflows (created_at);
