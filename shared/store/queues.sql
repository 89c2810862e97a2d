-- Queues: the count the KEDA trigger of each pool reads, each queue's state (for `jobfence
-- queue status` and the metrics), and a queue's settings (paused, a limit on its running
-- jobs, a rate of starts).
-- Named statements, run by the method of the same name in store/queues.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- scaler_value --
-- The postgresql trigger of one pool's KEDA ScaledJob; {queue} is filled in as a literal
-- (`jobfence pools render` writes this same text into the manifests). KEDA's default
-- scaling strategy starts ceil(value / target) Jobs minus the Jobs already running, so the
-- value counts ready work plus live claims — one-job-per-pod and draining pools alike —
-- capped at the queue's limit (more pods could not claim); with a limit on each group's
-- running jobs, a group's ready work counts only up to its room (a group at its limit
-- waits, whatever the pods); 0 while drain mode is on or the queue is paused. Index scans
-- only (jobs_ready_queue, jobs_running_group; jobs_ready_group a group at a time): its
-- cost does not grow with the number of finished jobs.
SELECT CASE
    WHEN (SELECT draining FROM {schema}.jobfence_control)
      OR coalesce((SELECT paused FROM {schema}.queues WHERE name = {{queue}}), false) THEN 0
    ELSE least(
        (SELECT count(*) FROM {schema}.jobs
         WHERE status = 'running' AND queue = {{queue}} AND NOT is_parent)
      + coalesce((SELECT CASE WHEN q.group_limit IS NOT NULL THEN (
            WITH RECURSIVE groups (g) AS (
                (SELECT coalesce(group_key, '') FROM {schema}.jobs
                 WHERE status = 'pending' AND queue = {{queue}}
                 ORDER BY coalesce(group_key, '') LIMIT 1)
                UNION ALL
                SELECT (SELECT coalesce(j.group_key, '') FROM {schema}.jobs j
                        WHERE j.status = 'pending' AND j.queue = {{queue}}
                          AND coalesce(j.group_key, '') > s.g
                        ORDER BY coalesce(j.group_key, '') LIMIT 1)
                FROM groups s WHERE s.g IS NOT NULL
            )
            SELECT coalesce(sum((
                SELECT count(*) FROM (
                    SELECT FROM {schema}.jobs j
                    WHERE j.status = 'pending' AND j.queue = {{queue}}
                      AND coalesce(j.group_key, '') = s.g AND j.visible_at <= now()
                    LIMIT greatest(0, q.group_limit - (
                        SELECT count(*) FROM {schema}.jobs r
                        WHERE r.status = 'running' AND r.queue = {{queue}} AND NOT r.is_parent
                          AND coalesce(r.group_key, '') = s.g))) ready)), 0)::bigint
            FROM groups s WHERE s.g IS NOT NULL) END
          FROM {schema}.queues q WHERE q.name = {{queue}}),
          (SELECT count(*) FROM {schema}.jobs
           WHERE status = 'pending' AND queue = {{queue}} AND visible_at <= now())),
        coalesce((SELECT max_running FROM {schema}.queues WHERE name = {{queue}}),
                 2147483647))
    END AS value;

-- pending_total --
-- Ready work and live claims of every queue, 0 while draining (what drain status reports).
SELECT CASE WHEN (SELECT draining FROM {schema}.jobfence_control) THEN 0
    ELSE (SELECT count(*) FROM {schema}.jobs WHERE status = 'pending' AND visible_at <= now())
       + (SELECT count(*) FROM {schema}.jobs WHERE status = 'running' AND NOT is_parent)
    END AS value;

-- status --
-- Every queue that has active jobs or settings, and `default` (or only the one named),
-- with its settings and its active jobs: pending (ready, or waiting out a retry delay),
-- scheduled (not before its run_at), running, waiting (on dependencies), and the age of
-- its oldest ready job. Index scans of active jobs only (jobs_active_queue).
WITH names AS (
    SELECT 'default'::text AS name
    UNION
    SELECT name FROM {schema}.queues
    UNION
    SELECT DISTINCT queue FROM {schema}.jobs WHERE status IN ('waiting', 'pending', 'running')
)
SELECT n.name AS queue, coalesce(q.paused, false) AS paused, q.max_running AS "limit",
    c.pending, c.scheduled, c.running, c.waiting, c.oldest_ready_age_seconds,
    q.rate_limit, extract(epoch FROM q.rate_period)::float8 AS rate_period_seconds,
    CASE WHEN q.rate_limit IS NOT NULL THEN
        (SELECT count(*) FROM {schema}.queue_starts s WHERE s.queue = n.name
           AND s.started_at >= clock_timestamp() - q.rate_period)::integer
    END AS rate_started,
    q.group_limit, coalesce(q.fair, false) AS fair
FROM names n
LEFT JOIN {schema}.queues q ON q.name = n.name
CROSS JOIN LATERAL (
    SELECT
        count(*) FILTER (WHERE j.status = 'pending'
                         AND (j.run_at IS NULL OR j.run_at <= now())) AS pending,
        count(*) FILTER (WHERE j.status = 'pending' AND j.run_at > now()) AS scheduled,
        count(*) FILTER (WHERE j.status = 'running' AND NOT j.is_parent) AS running,
        count(*) FILTER (WHERE j.status = 'waiting' AND j.parent_id IS NULL) AS waiting,
        coalesce(extract(epoch FROM now() - min(j.visible_at) FILTER (
            WHERE j.status = 'pending' AND j.visible_at <= now())), 0)::float8
            AS oldest_ready_age_seconds
    FROM {schema}.jobs j
    WHERE j.queue = n.name AND j.status IN ('waiting', 'pending', 'running')
) c
WHERE %(queue)s::text IS NULL OR n.name = %(queue)s
ORDER BY n.name;

-- rate --
-- Set or remove (NULLs) a queue's rate, recorded with who did it: operator_queue_rate.
SELECT {schema}.operator_queue_rate(%(queue)s::text, %(rate_limit)s::integer,
    %(period_seconds)s::float8, %(actor)s::text) AS name;

-- configure --
-- Pause, resume or limit a queue (the settings not given stay as they are), recorded with
-- who did it: operator_configure_queue.
SELECT {schema}.operator_configure_queue(%(queue)s::text, %(paused)s::boolean,
    %(set_limit)s::boolean, %(max_running)s::integer, %(reason)s::text, %(actor)s::text)
    AS name;

-- groups --
-- A queue's groups that have active jobs (the jobs without a group under NULL), with each
-- one's pending (due, or backing off), scheduled, running and waiting jobs, the most active
-- first, at most %(limit)s of them. Index scans of the queue's active jobs
-- (jobs_active_queue).
SELECT nullif(g.group_key, '') AS "group", g.pending, g.scheduled, g.running, g.waiting
FROM (
    SELECT coalesce(j.group_key, '') AS group_key,
        count(*) FILTER (WHERE j.status = 'pending'
                         AND (j.run_at IS NULL OR j.run_at <= now())) AS pending,
        count(*) FILTER (WHERE j.status = 'pending' AND j.run_at > now()) AS scheduled,
        count(*) FILTER (WHERE j.status = 'running' AND NOT j.is_parent) AS running,
        count(*) FILTER (WHERE j.status = 'waiting' AND j.parent_id IS NULL) AS waiting
    FROM {schema}.jobs j
    WHERE j.queue = %(queue)s AND j.status IN ('waiting', 'pending', 'running')
    GROUP BY 1
) g
WHERE g.pending + g.scheduled + g.running + g.waiting > 0
ORDER BY g.running + g.pending DESC, g.group_key
LIMIT %(limit)s;

-- set_groups --
-- Set a queue's limit on each group's running jobs (set_group_limit; NULL: none) or its
-- round-robin across groups (fair, when not NULL), recorded: operator_queue_groups.
SELECT {schema}.operator_queue_groups(%(queue)s::text, %(set_group_limit)s::boolean,
    %(group_limit)s::integer, %(fair)s::boolean, %(actor)s::text) AS name;
