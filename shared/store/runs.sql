-- Runs of the periodic functions and the totals their metrics read.
-- Named statements, run by the method of the same name in store/runs.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- run_started --
-- A periodic function's run begins (status running, or skipped when another run holds its
-- lease).
INSERT INTO {schema}.function_runs (function, trigger, status, host, finished_at,
    triggered_by, trigger_reason)
VALUES (%(function)s, %(trigger)s, %(status)s, %(host)s,
        CASE WHEN %(status)s = 'skipped' THEN now() END, %(triggered_by)s, %(reason)s)
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

-- add_duration --
-- A run that ran (not a skipped one): one more in the bucket its duration falls in
-- (`duration:<upper bound>`, buckets jobfence_buckets('pass')), and its duration to
-- `duration:sum`. The function's duration histogram, kept with its totals.
INSERT INTO {schema}.function_totals AS t (function, item, total)
SELECT %(function)s,
    CASE o.name WHEN 'duration' THEN 'duration:' || o.le::text ELSE 'duration:sum' END,
    o.value::numeric
FROM {schema}.jobfence_observation('duration', 'pass', %(seconds)s::float8) AS o
ON CONFLICT (function, item) DO UPDATE SET total = t.total + excluded.total;

-- set_status --
-- The function's last run; the last success is kept across failed runs, and so are the
-- values the last successful run saw. Failed runs since the last success are counted.
INSERT INTO {schema}.function_status AS f (function, last_run_at, last_status, last_trigger,
    last_duration_seconds, last_success_at, consecutive_failures, last_values)
VALUES (%(function)s, now(), %(status)s, %(trigger)s, %(duration)s,
        CASE WHEN %(status)s = 'succeeded' THEN now() END,
        CASE WHEN %(status)s = 'failed' THEN 1 ELSE 0 END, %(values)s::jsonb)
ON CONFLICT (function) DO UPDATE SET
    last_run_at = excluded.last_run_at, last_status = excluded.last_status,
    last_trigger = excluded.last_trigger,
    last_duration_seconds = excluded.last_duration_seconds,
    last_success_at = coalesce(excluded.last_success_at, f.last_success_at),
    consecutive_failures = CASE excluded.last_status
        WHEN 'succeeded' THEN 0
        WHEN 'failed' THEN f.consecutive_failures + 1
        ELSE f.consecutive_failures END,
    last_values = CASE WHEN excluded.last_status = 'succeeded' THEN excluded.last_values
                       ELSE f.last_values END;

-- function_status --
-- Every function's last run (or one function's).
SELECT function, last_run_at, last_status, last_trigger, last_duration_seconds,
    last_success_at, consecutive_failures, last_values
FROM {schema}.function_status
WHERE %(function)s::text IS NULL OR function = %(function)s
ORDER BY function;

-- function_totals --
-- Every function's totals (or one function's).
SELECT function, item, total FROM {schema}.function_totals
WHERE %(function)s::text IS NULL OR function = %(function)s
ORDER BY function, item;

-- lease_take --
-- Take the function's lease if no run holds it, or the holder's lease ran out (that run was
-- killed: its run id comes back as previous_run_id). Of two runs at the same moment exactly
-- one gets a row back: the other waits for the first's insert, then finds it unexpired.
INSERT INTO {schema}.function_leases AS l (function, holder, expires_at)
VALUES (%(function)s, %(holder)s, now() + make_interval(secs => %(seconds)s))
ON CONFLICT (function) DO UPDATE SET holder = excluded.holder, taken_at = now(),
    expires_at = excluded.expires_at, previous_run_id = l.run_id, run_id = NULL
WHERE l.expires_at <= now()
RETURNING previous_run_id;

-- lease_bind --
-- The run record of the lease's holder.
UPDATE {schema}.function_leases SET run_id = %(run_id)s
WHERE function = %(function)s AND holder = %(holder)s;

-- lease_renew --
-- Extend the holder's lease; no row when it is no longer the holder.
UPDATE {schema}.function_leases
SET expires_at = now() + make_interval(secs => %(seconds)s)
WHERE function = %(function)s AND holder = %(holder)s
RETURNING expires_at;

-- lease_release --
-- The run ended: the function is free (only if it is still the holder).
DELETE FROM {schema}.function_leases WHERE function = %(function)s AND holder = %(holder)s;

-- run_abandoned --
-- A run whose lease ran out while it was still running: it was killed (SIGKILL, a lost
-- node) before it could record its end.
UPDATE {schema}.function_runs SET status = 'interrupted', finished_at = now(),
    error = 'abandoned: the run stopped without recording its end (killed?) and its '
            'lease ran out'
WHERE run_id = %(run_id)s AND status = 'running'
RETURNING run_id;

-- recent --
-- The latest runs, newest first, optionally of one function and of one status.
SELECT run_id, function, trigger, triggered_by, trigger_reason, status, host, started_at,
    finished_at, extract(epoch FROM finished_at - started_at)::float8 AS duration_seconds,
    counts, error
FROM {schema}.function_runs
WHERE (%(function)s::text IS NULL OR function = %(function)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
ORDER BY run_id DESC
LIMIT %(limit)s;

-- latest_run_id --
-- The newest run's id (0 when there is none): runs begun later have larger ids.
SELECT coalesce(max(run_id), 0) AS run_id FROM {schema}.function_runs;

-- runs_after --
-- A function's runs begun after a run id, ended or not, oldest first (a bounded page).
SELECT run_id, function, trigger, triggered_by, trigger_reason, status, host, started_at,
    finished_at, extract(epoch FROM finished_at - started_at)::float8 AS duration_seconds,
    counts, error
FROM {schema}.function_runs
WHERE function = %(function)s AND run_id > %(after)s
ORDER BY run_id
LIMIT %(limit)s;
