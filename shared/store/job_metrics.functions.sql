-- Database functions of the job metrics: the histograms' buckets and the observations the
-- job metrics fold in (store/job_metrics.py; migrations 0015 and 0020 say how the totals
-- are kept).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- The bucket bounds of each histogram kind (seconds), +Inf last.
--
-- These helpers run with their caller's rights and search path (no SET of their own): the
-- triggers and definer functions that call them pin theirs, and each names every object of
-- the schema with it. A SET would keep PostgreSQL from inlining them into the calling
-- statement, and a trigger of one job's write would plan and run each as a function call
-- of its own (~100 µs a bucket).
CREATE OR REPLACE FUNCTION {schema}.jobfence_buckets(kind text) RETURNS float8[]
LANGUAGE sql IMMUTABLE AS $$
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
        -- peak memory: 1 MiB (2^20 bytes) to 64 GiB (2^36), doubling
        WHEN 'memory' THEN ARRAY[1048576, 2097152, 4194304, 8388608, 16777216, 33554432,
                                 67108864, 134217728, 268435456, 536870912, 1073741824,
                                 2147483648, 4294967296, 8589934592, 17179869184,
                                 34359738368, 68719476736, 'Infinity']::float8[]
    END
$$;

-- The upper bound of the histogram bucket `seconds` falls in (NULL for no seconds).
CREATE OR REPLACE FUNCTION {schema}.jobfence_bucket(kind text, seconds float8) RETURNS float8
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    bound float8;
BEGIN
    FOREACH bound IN ARRAY {schema}.jobfence_buckets(kind) LOOP
        IF seconds <= bound THEN
            RETURN bound;
        END IF;
    END LOOP;
    RETURN 'Infinity';
END
$$;

-- One observation of a histogram, as the rows it adds: one to the bucket `seconds` falls in
-- (a negative value counts as 0), and `seconds` to `<name>_sum`.
CREATE OR REPLACE FUNCTION {schema}.jobfence_observation(
    p_name text, p_buckets text, p_seconds float8)
RETURNS TABLE (name text, le float8, value float8)
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_name, {schema}.jobfence_bucket(p_buckets, greatest(p_seconds, 0)), 1::float8
    UNION ALL
    SELECT p_name || '_sum', 'Infinity'::float8, greatest(p_seconds, 0)
$$;

-- What a worker's guards' ticks raised, counted by guard into the job metrics.
CREATE OR REPLACE FUNCTION {schema}.worker_guard_faults(
    p_queue text, p_guards text[], p_counts bigint[])
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    INSERT INTO {schema}.job_metric_deltas (queue, name, label, le, value)
    SELECT p_queue, 'guard_faults', f.guard, 'Infinity', least(f.n, 1000000000)::float8
    FROM unnest(p_guards, p_counts) AS f (guard, n)
    WHERE f.n > 0
      AND f.guard IN ('heartbeat', 'stop_check', 'watchdog', 'tree_kill', 'output', 'sidecar')
      AND p_queue ~ '^[a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?$'
$$;
