-- The periodic passes over jobs: reclaims, run timeouts, pending expiry, retention.
-- Named statements, run by the method of the same name in store/maintenance.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- reclaim_expired --
-- Expired leases, oldest first, in a bounded batch: rotate the fence, then back to pending
-- with backoff, or failed once attempts are exhausted (jobfence_reclaim).
WITH expired AS (
    SELECT job_id, 'lease expired (claimed by ' || coalesce(claimed_by, '?') || ')' AS why
    FROM {schema}.jobs
    WHERE status = 'running' AND NOT is_parent
      AND visible_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY visible_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
SELECT r.job_id, r.status, r.parent_id
FROM {schema}.jobfence_reclaim(
    ARRAY(SELECT job_id FROM expired ORDER BY job_id),
    ARRAY(SELECT why FROM expired ORDER BY job_id),
    ARRAY(SELECT 'lease expired' FROM expired ORDER BY job_id),
    %(base_seconds)s, %(cap_seconds)s,
    ARRAY(SELECT false FROM expired ORDER BY job_id)) AS r;

-- reclaim_timed_out --
-- Running jobs past their run deadline, oldest first, in a bounded batch: rotate the fence
-- (its worker is told at once and kills its child; the attempt stays "stopping", holding
-- the job, until the worker confirms or its lease ends), then back to pending
-- with backoff, or failed "timed out" once attempts are exhausted (jobfence_reclaim). The
-- timed-out attempt was counted at its claim, so it counts as a failed one. How late each
-- was stopped after its deadline is recorded (lifecycle_lag, timeout) in the same statement.
WITH overdue AS (
    SELECT job_id, queue, 'timed out: ran longer than its timeout (attempt ' || attempt_count
        || ' of ' || max_attempts || ', claimed by ' || coalesce(claimed_by, '?') || ')' AS why,
        extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - run_deadline_at)::float8
            AS late
    FROM {schema}.jobs
    WHERE status = 'running' AND run_deadline_at IS NOT NULL AND NOT is_parent
      AND run_deadline_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY run_deadline_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
), observed AS (
    INSERT INTO {schema}.job_metric_deltas (queue, name, label, le, value)
    SELECT o.queue, m.name, 'timeout', m.le, sum(m.value)
    FROM overdue o CROSS JOIN LATERAL {schema}.jobfence_observation('lifecycle_lag', 'lag',
                                                                    o.late) m
    GROUP BY o.queue, m.name, m.le
)
SELECT r.job_id, r.status, r.parent_id
FROM {schema}.jobfence_reclaim(
    ARRAY(SELECT job_id FROM overdue ORDER BY job_id),
    ARRAY(SELECT why FROM overdue ORDER BY job_id),
    ARRAY(SELECT 'timed out' FROM overdue ORDER BY job_id),
    %(base_seconds)s, %(cap_seconds)s,
    ARRAY(SELECT true FROM overdue ORDER BY job_id)) AS r;

-- release_stopped --
-- Stopping attempts whose lease has run out, in a bounded batch: their worker never
-- confirmed that its command is gone (it died, or was cut off), and the lease bounds how
-- long it may have run. Their jobs' resources are free again, a pending one claimable.
SELECT job_id FROM {schema}.jobfence_release_stopped(%(batch_size)s::integer) AS job_id;

-- expire_pending --
-- Waiting or pending jobs never started, past their expires_at, in a bounded batch:
-- cancelled "expired before start". A job that started once (snoozed, waiting for its
-- retry, given back on SIGTERM, reclaimed) is never expired. Never claimed, so there is no
-- fence to rotate. How late each was cancelled after it expired is recorded (lifecycle_lag,
-- expiry) in the same statement.
WITH expired AS (
    SELECT job_id, queue,
        extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - expires_at)::float8 AS late
    FROM {schema}.jobs
    WHERE status IN ('waiting', 'pending') AND expires_at IS NOT NULL AND started_at IS NULL
      AND expires_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
), observed AS (
    INSERT INTO {schema}.job_metric_deltas (queue, name, label, le, value)
    SELECT e.queue, m.name, 'expiry', m.le, sum(m.value)
    FROM expired e CROSS JOIN LATERAL {schema}.jobfence_observation('lifecycle_lag', 'lag',
                                                                    e.late) m
    GROUP BY e.queue, m.name, m.le
)
UPDATE {schema}.jobs j SET
    status = 'cancelled',
    finished_at = now(),
    retain_until = now() + j.ttl,
    reason = 'expired before start',
    error = 'expired before start'
FROM expired e
WHERE j.job_id = e.job_id
RETURNING j.job_id, j.status, j.parent_id, j.is_parent;

-- cancel_children_of_expired --
-- Parents that expired while waiting: their waiting children will never run. Same
-- transaction as the parents' expiry, so no child is left waiting on a cancelled parent.
UPDATE {schema}.jobs SET status = 'cancelled', finished_at = now(), retain_until = now() + ttl,
    reason = 'parent expired before start', error = 'parent expired before start'
WHERE parent_id = ANY(%(parent_ids)s::uuid[]) AND status = 'waiting'
RETURNING job_id, status, parent_id;

-- retention_due_with_ttl --
-- Top-level terminal jobs with a ttl whose retain_until has passed, in (retain_until,
-- job_id) order after a cursor (a job whose objects could not be deleted stays behind it
-- until the next pass; the first page starts at the year 1). has_outputs: whether an
-- attempt registered an output or a command's log, i.e. whether the job can own objects
-- under its prefix (one index probe per row: LIMIT 1 in a lateral join is never turned into a hash of the
-- whole job_outputs table).
SELECT j.job_id, j.is_parent, j.retain_until AS due,
    o.found IS NOT NULL AS has_outputs
FROM {schema}.jobs j
LEFT JOIN LATERAL (SELECT true AS found FROM {schema}.job_outputs o
                   WHERE o.job_id = j.job_id
                   UNION ALL
                   SELECT true FROM {schema}.job_logs l WHERE l.job_id = j.job_id
                   LIMIT 1) o ON true
WHERE j.parent_id IS NULL AND j.retain_until IS NOT NULL
  AND j.retain_until <= coalesce(%(now)s::timestamptz, now())
  AND j.status IN ('succeeded', 'failed', 'cancelled')
  AND (j.retain_until, j.job_id) > (%(after_due)s::timestamptz, %(after_id)s::uuid)
ORDER BY j.retain_until, j.job_id
LIMIT %(limit)s;

-- retention_due_without_ttl --
-- Top-level terminal jobs without a ttl that finished more than the default retention ago,
-- in (finished_at, job_id) order after a cursor; as retention_ttl_page otherwise.
SELECT j.job_id, j.is_parent, j.finished_at AS due,
    o.found IS NOT NULL AS has_outputs
FROM {schema}.jobs j
LEFT JOIN LATERAL (SELECT true AS found FROM {schema}.job_outputs o
                   WHERE o.job_id = j.job_id
                   UNION ALL
                   SELECT true FROM {schema}.job_logs l WHERE l.job_id = j.job_id
                   LIMIT 1) o ON true
WHERE j.parent_id IS NULL AND j.ttl IS NULL AND j.finished_at IS NOT NULL
  AND j.finished_at <= coalesce(%(now)s::timestamptz, now())
                       - make_interval(secs => %(retention_seconds)s)
  AND j.status IN ('succeeded', 'failed', 'cancelled')
  AND (j.finished_at, j.job_id) > (%(after_due)s::timestamptz, %(after_id)s::uuid)
ORDER BY j.finished_at, j.job_id
LIMIT %(limit)s;

-- retention_children --
-- One page of a parent's children in id order, each with whether it registered outputs.
SELECT c.job_id,
    o.found IS NOT NULL AS has_outputs
FROM {schema}.jobs c
LEFT JOIN LATERAL (SELECT true AS found FROM {schema}.job_outputs o
                   WHERE o.job_id = c.job_id
                   UNION ALL
                   SELECT true FROM {schema}.job_logs l WHERE l.job_id = c.job_id
                   LIMIT 1) o ON true
WHERE c.parent_id = %(parent_id)s AND c.job_id > %(after)s
ORDER BY c.job_id
LIMIT %(limit)s;

-- delete_children --
-- Delete one bounded batch of a terminal parent's terminal children (their action results
-- and outputs cascade: a few rows per child).
DELETE FROM {schema}.jobs
WHERE job_id IN (
    SELECT c.job_id FROM {schema}.jobs c
    WHERE c.parent_id = %(parent_id)s AND c.status IN ('succeeded', 'failed', 'cancelled')
    ORDER BY c.job_id
    LIMIT %(limit)s
)
RETURNING job_id;

-- delete_jobs --
-- Delete top-level terminal jobs whose objects are gone. A parent goes only once it has no
-- child left (its children are deleted first, batch by batch): the parent_id cascade never
-- deletes an unbounded number of children in one statement. How late each went after its
-- retention ended (its retain_until, or without a ttl its finish plus the default
-- retention) is recorded (lifecycle_lag, retention) in the same statement.
WITH gone AS (
    DELETE FROM {schema}.jobs j
    WHERE j.job_id = ANY(%(job_ids)s::uuid[]) AND j.parent_id IS NULL
      AND j.status IN ('succeeded', 'failed', 'cancelled')
      AND NOT EXISTS (SELECT 1 FROM {schema}.jobs c WHERE c.parent_id = j.job_id)
    RETURNING j.job_id, j.queue,
        extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - coalesce(
            j.retain_until,
            j.finished_at + make_interval(secs => %(retention_seconds)s)))::float8 AS late
), observed AS (
    INSERT INTO {schema}.job_metric_deltas (queue, name, label, le, value)
    SELECT g.queue, m.name, 'retention', m.le, sum(m.value)
    FROM gone g CROSS JOIN LATERAL {schema}.jobfence_observation('lifecycle_lag', 'lag',
                                                                 g.late) m
    WHERE g.late IS NOT NULL
    GROUP BY g.queue, m.name, m.le
)
SELECT job_id FROM gone;

-- delete_old_events --
-- Delete one bounded batch of audit events older than the audit retention, oldest first.
DELETE FROM {schema}.job_events
WHERE event_id IN (
    SELECT event_id FROM {schema}.job_events
    WHERE at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention_seconds)s)
    ORDER BY at
    LIMIT %(limit)s
);

-- delete_old_control_events --
-- Delete one bounded batch of operators' changes (queues, drain, triggers) older than the
-- audit retention, oldest first.
DELETE FROM {schema}.control_events
WHERE event_id IN (
    SELECT event_id FROM {schema}.control_events
    WHERE at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention_seconds)s)
    ORDER BY at
    LIMIT %(limit)s
);

-- delete_old_function_runs --
-- Delete one bounded batch of function-run records older than their retention.
DELETE FROM {schema}.function_runs
WHERE run_id IN (
    SELECT run_id FROM {schema}.function_runs
    WHERE started_at < coalesce(%(now)s::timestamptz, now())
                       - make_interval(secs => %(retention_seconds)s)
    ORDER BY started_at
    LIMIT %(limit)s
);

-- delete_old_function_triggers --
-- Delete one bounded batch of manual-trigger records older than the function runs' retention.
DELETE FROM {schema}.function_triggers
WHERE trigger_id IN (
    SELECT trigger_id FROM {schema}.function_triggers
    WHERE requested_at < coalesce(%(now)s::timestamptz, now())
                         - make_interval(secs => %(retention_seconds)s)
    ORDER BY trigger_id
    LIMIT %(limit)s
);

-- delete_old_schedule_ticks --
-- Delete one bounded batch of schedules' recorded ticks older than the function runs'
-- retention (a schedule's exactly-once rests on its next tick, never on this record).
DELETE FROM {schema}.schedule_ticks
WHERE (schedule_id, tick_at) IN (
    SELECT schedule_id, tick_at FROM {schema}.schedule_ticks
    WHERE at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention_seconds)s)
    ORDER BY at
    LIMIT %(limit)s
);

-- delete_old_workflows --
-- Delete one bounded batch of workflows submitted before the audit retention whose steps
-- are all gone (retention deleted them), oldest first.
DELETE FROM {schema}.workflows
WHERE workflow_id IN (
    SELECT w.workflow_id FROM {schema}.workflows w
    WHERE w.created_at < coalesce(%(now)s::timestamptz, now())
                         - make_interval(secs => %(retention_seconds)s)
      AND NOT EXISTS (SELECT FROM {schema}.jobs j WHERE j.workflow_id = w.workflow_id)
    ORDER BY w.created_at
    LIMIT %(limit)s
);
