-- Runs of the periodic functions and the totals their metrics read.
-- Named statements, run by the method of the same name in store/runs.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- run_started --
-- A periodic function's run begins (status running, or skipped when another run holds its
-- lock).
INSERT INTO {schema}.function_runs (function, trigger, status, host, finished_at)
VALUES (%(function)s, %(trigger)s, %(status)s, %(host)s,
        CASE WHEN %(status)s = 'skipped' THEN now() END)
RETURNING run_id;

-- run_finished --
-- A periodic function's run ends, with its counts.
UPDATE {schema}.function_runs SET status = %(status)s, finished_at = now(), counts = %(counts)s,
    error = %(error)s
WHERE run_id = %(run_id)s;

-- add_totals --
-- Add a run's counts (and one to its runs-by-status counter) to the function's totals.
INSERT INTO {schema}.function_totals (function, item, total)
SELECT %(function)s, t.key, t.value::numeric FROM jsonb_each_text(%(totals)s::jsonb) AS t
ON CONFLICT (function, item) DO UPDATE SET total = function_totals.total + excluded.total;

-- set_status --
-- The function's last run; the last success is kept across failed runs.
INSERT INTO {schema}.function_status (function, last_run_at, last_status, last_trigger,
    last_duration_seconds, last_success_at)
VALUES (%(function)s, now(), %(status)s, %(trigger)s, %(duration)s,
        CASE WHEN %(status)s = 'succeeded' THEN now() END)
ON CONFLICT (function) DO UPDATE SET
    last_run_at = excluded.last_run_at, last_status = excluded.last_status,
    last_trigger = excluded.last_trigger,
    last_duration_seconds = excluded.last_duration_seconds,
    last_success_at = coalesce(excluded.last_success_at, function_status.last_success_at);

-- function_status --
-- Every function's last run (or one function's).
SELECT function, last_run_at, last_status, last_trigger, last_duration_seconds,
    last_success_at
FROM {schema}.function_status
WHERE %(function)s::text IS NULL OR function = %(function)s
ORDER BY function;

-- function_totals --
-- Every function's totals (or one function's).
SELECT function, item, total FROM {schema}.function_totals
WHERE %(function)s::text IS NULL OR function = %(function)s
ORDER BY function, item;

-- try_lock --
-- Take the session-level advisory lock of a function if it is free (one run at a time).
SELECT pg_try_advisory_lock(%(namespace)s, %(key)s) AS ok;

-- unlock --
-- Release the session-level advisory lock of a function.
SELECT pg_advisory_unlock(%(namespace)s, %(key)s);
