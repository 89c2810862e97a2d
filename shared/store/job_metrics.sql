-- Job metrics: what the audit trigger appends per transition statement, folded into the
-- totals the exposition reads (migration 0015 says how).
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

-- totals --
-- Every job metric total, by queue.
SELECT queue, name, label, le, value FROM {schema}.job_metrics ORDER BY queue, name, label, le;

-- buckets --
-- The upper bounds of each histogram's buckets, +Inf last.
SELECT {schema}.jobfence_buckets('wait') AS wait, {schema}.jobfence_buckets('run') AS run;

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
