-- 0029: action metrics by queue and action (docs/DESIGN.md, "Metrics by action").
--
-- * What is observed: every action outcome a worker stores (a row of job_action_results,
--   written by worker_record_action, worker_finish, worker_finish_many or worker_release,
--   each only under its attempt's fence) adds one run by outcome (succeeded, failed), its
--   run time (started -> stored) to a histogram, and — when its result carries a `usage`
--   object with `cpu_seconds` and `peak_memory_bytes` — each number it carries to a
--   histogram of its own. A write that lost its fence stores no row and observes nothing;
--   the same action written again (a write retried after its outcome was lost with the
--   connection) updates its row and observes nothing more: one run, one observation.
-- * How: a statement-level trigger on job_action_results appends what the statement adds
--   to action_metric_deltas, one row per (queue, action, metric, bucket) — insert-only, so
--   that no two workers ever wait on one row — and every periodic pass folds the deltas
--   into action_metrics (one DELETE ... RETURNING, exactly once), as 0015 does for jobs.
-- * Bounded labels: an action's label is its name only when a worker registered that name
--   (worker_register_actions, once per worker process: the names of its registry, built-ins
--   and installed plugins); any other name (a job enqueued around the registry, a plugin
--   no worker has any more) counts as `other`. The table of names keeps at most 1000; a
--   name no worker registered for 30 days is forgotten by the fold, with its totals.
--
-- Additive: old workers write results as before (their names count once a new worker has
-- registered them; the built-ins are known from the start).

CREATE OR REPLACE FUNCTION {schema}.jobfence_buckets(kind text) RETURNS float8[]
LANGUAGE sql IMMUTABLE SET search_path = {schema}, pg_temp AS $$
    SELECT CASE kind
        WHEN 'wait' THEN ARRAY[0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
                               'Infinity']::float8[]
        WHEN 'run' THEN ARRAY[1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400,
                              'Infinity']::float8[]
        WHEN 'pass' THEN ARRAY[0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 'Infinity']::float8[]
        WHEN 'lag' THEN ARRAY[0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
                              21600, 86400, 'Infinity']::float8[]
        -- an action's run time: the job run buckets, with room below a second
        WHEN 'action' THEN ARRAY[0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
                                 7200, 21600, 86400, 'Infinity']::float8[]
        -- CPU seconds: 10 ms to an hour
        WHEN 'cpu' THEN ARRAY[0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600,
                              'Infinity']::float8[]
        -- peak memory: 1 MiB to 64 GiB, doubling
        WHEN 'memory' THEN ARRAY(SELECT power(2, e)::float8 FROM generate_series(20, 36) e
                                 ORDER BY e)
                           || 'Infinity'::float8
    END
$$;

CREATE TABLE {schema}.action_names (
    name          text PRIMARY KEY,
    registered_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {schema}.action_names (name) VALUES ('command'), ('sleep');

CREATE TABLE {schema}.action_metrics (
    queue  text NOT NULL,
    -- a registered action's name, or 'other'
    action text NOT NULL,
    -- runs | run | run_sum | cpu | cpu_sum | memory | memory_sum
    name   text NOT NULL,
    -- runs: the outcome (succeeded, failed); '' otherwise
    label  text NOT NULL DEFAULT '',
    -- run, cpu, memory: the bucket's upper bound; Infinity otherwise
    le     float8 NOT NULL DEFAULT 'Infinity',
    value  float8 NOT NULL,
    PRIMARY KEY (queue, action, name, label, le)
);

CREATE TABLE {schema}.action_metric_deltas (
    queue  text NOT NULL,
    action text NOT NULL,
    name   text NOT NULL,
    label  text NOT NULL,
    le     float8 NOT NULL,
    value  float8 NOT NULL
);

-- A number a result's usage carries (`usage` -> key), or NULL when it carries none: any
-- other shape (not an object, not a number) is no usage, never an error in the worker's
-- write. A negative number counts as 0; one past 1e18 as 1e18 (a float8 cast never fails).
CREATE FUNCTION {schema}.jobfence_usage(p_result jsonb, p_key text) RETURNS float8
LANGUAGE sql IMMUTABLE SET search_path = {schema}, pg_temp AS $$
    SELECT CASE WHEN jsonb_typeof(p_result -> 'usage' -> p_key) = 'number'
                THEN least(greatest((p_result -> 'usage' ->> p_key)::numeric, 0),
                           1e18)::float8
           END
$$;

-- What a statement's new action rows add to the action metrics. The job's queue is one
-- primary-key probe per row; the name one probe of the small table of names.
CREATE FUNCTION {schema}.jobfence_action_observed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    WITH r AS MATERIALIZED (
        SELECT coalesce((SELECT j.queue FROM {schema}.jobs j WHERE j.job_id = n.job_id),
                        'default') AS queue,
               CASE WHEN EXISTS (SELECT FROM {schema}.action_names a WHERE a.name = n.name)
                    THEN n.name ELSE 'other' END AS action,
               n.status,
               extract(epoch FROM n.finished_at - n.started_at)::float8 AS ran,
               {schema}.jobfence_usage(n.result, 'cpu_seconds') AS cpu,
               {schema}.jobfence_usage(n.result, 'peak_memory_bytes') AS memory
        FROM new_rows n
    )
    INSERT INTO {schema}.action_metric_deltas (queue, action, name, label, le, value)
    SELECT m.queue, m.action, m.name, m.label, m.le, sum(m.value)
    FROM (
        SELECT r.queue, r.action, 'runs' AS name, r.status AS label,
               'Infinity'::float8 AS le, 1::float8 AS value
        FROM r
        UNION ALL
        SELECT r.queue, r.action, o.name, '', o.le, o.value
        FROM r, {schema}.jobfence_observation('run', 'action', r.ran) o
        UNION ALL
        SELECT r.queue, r.action, o.name, '', o.le, o.value
        FROM r, {schema}.jobfence_observation('cpu', 'cpu', r.cpu) o
        WHERE r.cpu IS NOT NULL
        UNION ALL
        SELECT r.queue, r.action, o.name, '', o.le, o.value
        FROM r, {schema}.jobfence_observation('memory', 'memory', r.memory) o
        WHERE r.memory IS NOT NULL
    ) m
    GROUP BY m.queue, m.action, m.name, m.label, m.le;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_action_results_observed AFTER INSERT ON {schema}.job_action_results
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.jobfence_action_observed();

-- A worker's registry: the names it may run, known from now on as labels of their own.
-- A name already known is dated again at most once an hour (no write at most starts); at
-- most 1000 names are kept, each at most 200 characters; how many were new.
CREATE FUNCTION {schema}.worker_register_actions(p_names text[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    added integer;
BEGIN
    PERFORM {schema}.jobfence_check_batch('register_actions', cardinality(p_names));
    WITH given AS (
        SELECT x.name,
               EXISTS (SELECT FROM {schema}.action_names k WHERE k.name = x.name) AS known
        FROM (SELECT DISTINCT y.name FROM unnest(p_names) AS y (name)
              WHERE length(y.name) BETWEEN 1 AND 200) x
    ), numbered AS (
        SELECT g.name, g.known,
               count(*) FILTER (WHERE NOT g.known) OVER (ORDER BY g.name) AS nth_new
        FROM given g
    ), fresh AS (
        INSERT INTO {schema}.action_names AS a (name)
        SELECT n.name FROM numbered n
        WHERE n.known OR n.nth_new <= 1000 - (SELECT count(*) FROM {schema}.action_names)
        ON CONFLICT (name) DO UPDATE SET registered_at = now()
        WHERE a.registered_at < now() - interval '1 hour'
        RETURNING (xmax = 0) AS inserted
    )
    SELECT count(*) FILTER (WHERE inserted) INTO added FROM fresh;
    RETURN added;
END
$$;
