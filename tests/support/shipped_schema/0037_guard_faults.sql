-- 0037: a worker's guard faults, counted (docs/REFERENCE.md, invariant 15).
--
-- A worker's guards (the heartbeat, the stop checks, the watchdog, a job's tree kill, the
-- pump of a child's output, the command sidecar's channel) note whatever one of their ticks
-- raised and go on; the counts by guard go to the database with a later heartbeat, as
-- deltas of the job metrics (name 'guard_faults', label the guard), folded by the next
-- periodic pass like every transition's and read as jobfence_worker_guard_faults.
--
-- Bounded: only the guards jobfence has (a fixed set of labels), the worker's own queue
-- name as it is stored (a DNS label), a count between 1 and 1e9 per call.
-- Additive: a worker of an older release never calls it.

CREATE FUNCTION {schema}.worker_guard_faults(p_queue text, p_guards text[], p_counts bigint[])
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    INSERT INTO {schema}.job_metric_deltas (queue, name, label, le, value)
    SELECT p_queue, 'guard_faults', f.guard, 'Infinity', least(f.n, 1000000000)::float8
    FROM unnest(p_guards, p_counts) AS f (guard, n)
    WHERE f.n > 0
      AND f.guard IN ('heartbeat', 'stop_check', 'watchdog', 'tree_kill', 'output', 'sidecar')
      AND p_queue ~ '^[a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?$'
$$;
