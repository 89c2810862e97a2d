-- Job metrics: what the audit trigger (and lifecycle, for its lateness) appends per
-- statement, folded into the totals the exposition reads (the trigger: jobs.functions.sql,
-- the histograms: job_metrics.functions.sql; migrations 0015 and 0020 say why).
-- Named statements, run by the method of the same name in store/job_metrics.py. {schema}
-- is the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- fold --
-- Move every committed delta into the totals, exactly once (a delta committed after this
-- statement began is left for the next fold); how many deltas were folded.
-- The same deltas go to the minute their transitions committed in job_metric_history (the
-- queue page's chart), which keeps a day.
WITH moved AS (
    DELETE FROM {schema}.job_metric_deltas RETURNING queue, name, label, le, value, at
), summed AS (
    SELECT queue, name, label, le, sum(value) AS value, count(*) AS deltas
    FROM moved GROUP BY queue, name, label, le
), added AS (
    INSERT INTO {schema}.job_metrics AS m (queue, name, label, le, value)
    SELECT queue, name, label, le, value FROM summed
    ON CONFLICT (queue, name, label, le) DO UPDATE SET value = m.value + excluded.value
), minutes AS (
    INSERT INTO {schema}.job_metric_history AS h (minute, queue, name, label, le, value)
    SELECT date_trunc('minute', at), queue, name, label, le, sum(value)
    FROM moved GROUP BY 1, queue, name, label, le
    ON CONFLICT (minute, queue, name, label, le) DO UPDATE SET value = h.value + excluded.value
), pruned AS (
    DELETE FROM {schema}.job_metric_history WHERE minute < now() - interval '1 day'
)
SELECT coalesce(sum(deltas), 0)::bigint AS folded FROM summed;

-- history --
-- A queue's minutes since a time: jobs finished by status, claims (the wait histogram's
-- count) and the run-time histogram's buckets, as folded.
SELECT minute, name, label, le, value FROM {schema}.job_metric_history
WHERE queue = %(queue)s AND minute >= %(since)s
  AND name IN ('finished', 'wait', 'run')
ORDER BY minute;

-- guard_faults --
-- A worker's guard faults since its last such write, by guard: counted like a transition
-- (a delta, folded by the next pass), labels bounded by the function.
SELECT {schema}.worker_guard_faults(%(queue)s, %(guards)s::text[], %(counts)s::bigint[]);

-- totals --
-- Every job metric total, by queue.
SELECT queue, name, label, le, value FROM {schema}.job_metrics ORDER BY queue, name, label, le;

-- buckets --
-- The upper bounds of each kind of histogram's buckets, +Inf last: wait and run (jobs),
-- pass (the periodic functions' durations), lag (lifecycle's and finalization's lateness).
SELECT {schema}.jobfence_buckets('wait') AS wait, {schema}.jobfence_buckets('run') AS run,
    {schema}.jobfence_buckets('pass') AS pass, {schema}.jobfence_buckets('lag') AS lag;

-- overdue --
-- For each kind of deadline lifecycle enforces, how long ago the oldest one it has not
-- enforced yet came due (0 when none has): a running job's run deadline, a waiting or
-- pending job's expiry, a finished top-level job's retention (its retain_until or, without
-- a ttl, its finish plus the default retention when one is given). Each is one probe of a
-- partial index: the cost does not grow with the number of jobs.
SELECT k.kind, greatest(0, coalesce(extract(epoch FROM now() - k.due), 0))::float8 AS seconds
FROM (
    SELECT 'timeout' AS kind, (SELECT min(run_deadline_at) FROM {schema}.jobs
                               WHERE status = 'running' AND run_deadline_at IS NOT NULL) AS due
    UNION ALL
    SELECT 'expiry', (SELECT min(expires_at) FROM {schema}.jobs
                      WHERE status IN ('waiting', 'pending') AND expires_at IS NOT NULL)
    UNION ALL
    SELECT 'retention', least(
        (SELECT min(retain_until) FROM {schema}.jobs
         WHERE parent_id IS NULL AND retain_until IS NOT NULL),
        (SELECT min(finished_at) FROM {schema}.jobs
         WHERE parent_id IS NULL AND ttl IS NULL AND finished_at IS NOT NULL)
            + make_interval(secs => %(retention_seconds)s::float8))
) k
ORDER BY k.kind;

-- claims --
-- Per queue: the last minute a claim was folded (history keeps a day), and whether a job
-- of the queue was ever claimed.
SELECT q.queue,
       (SELECT max(h.minute) FROM {schema}.job_metric_history h
        WHERE h.queue = q.queue AND h.name = 'wait') AS last_claim,
       EXISTS (SELECT FROM {schema}.job_metrics m
               WHERE m.queue = q.queue AND m.name = 'wait' AND m.value > 0) AS ever
FROM unnest(%(queues)s::text[]) AS q (queue);

-- recent_queues --
-- Queues that finished or claimed anything in the last hour (the queue page shows them,
-- active jobs or not).
SELECT DISTINCT queue FROM {schema}.job_metric_history
WHERE minute >= now() - interval '1 hour' ORDER BY queue;
