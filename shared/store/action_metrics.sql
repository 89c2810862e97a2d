-- Action metrics: runs by outcome, run time and resource usage, by queue and action. The
-- trigger on job_action_results appends what each statement adds; the periodic passes fold
-- it into the totals the exposition reads (the trigger: action_metrics.functions.sql;
-- migration 0029 says why).
-- Named statements, run by the method of the same name in store/action_metrics.py. {schema}
-- is the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- register --
-- A worker's action names, known as labels of their own from now on; how many were new.
SELECT {schema}.worker_register_actions(%(names)s::text[]) AS added;

-- fold --
-- Move every committed delta into the totals, exactly once (a delta committed after this
-- statement began is left for the next fold); forget the names no worker registered for 30
-- days, and their totals (an uninstalled plugin's series end); how many deltas were folded.
WITH moved AS (
    DELETE FROM {schema}.action_metric_deltas RETURNING queue, action, name, label, le, value
), summed AS (
    SELECT queue, action, name, label, le, sum(value) AS value, count(*) AS deltas
    FROM moved GROUP BY queue, action, name, label, le
), added AS (
    INSERT INTO {schema}.action_metrics AS m (queue, action, name, label, le, value)
    SELECT queue, action, name, label, le, value FROM summed
    ON CONFLICT (queue, action, name, label, le) DO UPDATE SET value = m.value + excluded.value
), forgotten AS (
    DELETE FROM {schema}.action_names WHERE registered_at < now() - interval '30 days'
    RETURNING name
), pruned AS (
    DELETE FROM {schema}.action_metrics WHERE action IN (SELECT name FROM forgotten)
)
SELECT coalesce(sum(deltas), 0)::bigint AS folded FROM summed;

-- totals --
-- Every action metric total, by queue and action.
SELECT queue, action, name, label, le, value FROM {schema}.action_metrics
ORDER BY queue, action, name, label, le;

-- buckets --
-- The upper bounds of the action histograms' buckets, +Inf last: run time, CPU seconds,
-- peak memory bytes.
SELECT {schema}.jobfence_buckets('action') AS action, {schema}.jobfence_buckets('cpu') AS cpu,
    {schema}.jobfence_buckets('memory') AS memory;
