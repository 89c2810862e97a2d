-- Database functions of the action metrics, kept by a trigger on action results, and the
-- worker's registry of action names (store/action_metrics.py; migration 0029 says how).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- A number a result's usage carries (`usage` -> key), or NULL when it carries none: any
-- other shape (not an object, not a number) is no usage, never an error in the worker's
-- write. A negative number counts as 0; one past 1e18 as 1e18 (a float8 cast never fails).
-- No SET of its own, so that it is inlined (job_metrics.functions.sql says why).
CREATE OR REPLACE FUNCTION {schema}.jobfence_usage(p_result jsonb, p_key text) RETURNS float8
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(p_result -> 'usage' -> p_key) = 'number'
                THEN least(greatest((p_result -> 'usage' ->> p_key)::numeric, 0),
                           1e18)::float8
           END
$$;

-- What a statement's new action rows add to the action metrics. The job's queue is one
-- primary-key probe per row; the name one probe of the small table of names.
CREATE OR REPLACE FUNCTION {schema}.jobfence_action_observed() RETURNS trigger
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

DROP TRIGGER IF EXISTS job_action_results_observed ON {schema}.job_action_results;
CREATE TRIGGER job_action_results_observed AFTER INSERT ON {schema}.job_action_results
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.jobfence_action_observed();

-- A worker's registry: the names it may run, known from now on as labels of their own.
-- A name already known is dated again at most once an hour (no write at most starts); at
-- most 1000 names are kept, each at most 200 characters; how many were new.
CREATE OR REPLACE FUNCTION {schema}.worker_register_actions(p_names text[])
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
