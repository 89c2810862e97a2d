-- Named queries of the fenced store, parsed once by shared.queries.
-- A block starts with `-- name --`, then a one-line description, then the statement.
-- Every write after a claim carries the fence: `attempt_id = %(attempt_id)s`, a live lease
-- (`visible_at > clock_timestamp()`), and RETURNING, so the caller learns whether it still
-- held it. The lease is checked against the clock when the row is checked — after any lock
-- wait, since a row lock makes PostgreSQL re-check the row — not against `now()`, the
-- transaction's start: a write that waited on a lock past its lease matches nothing.

-- control_drain_get --
-- Whether drain mode is on, and since when.
SELECT draining, drain_changed_at, drain_reason FROM jobfence_control;

-- control_drain_lock --
-- Enqueue takes this share lock so that `drain on` waits for enqueues already under way.
SELECT draining FROM jobfence_control FOR SHARE;

-- control_drain_set --
-- Switch drain mode on or off.
UPDATE jobfence_control
SET draining = %(draining)s, drain_changed_at = now(), drain_reason = %(reason)s
RETURNING draining, drain_changed_at, drain_reason;

-- job_insert_many --
-- Insert a batch of new jobs (a datum parent starts out running, never claimed); a repeated
-- idempotency key inserts nothing for that job.
INSERT INTO jobs (
    job_id, status, actions, resource, priority, max_attempts, visible_at, parent_id,
    is_parent, inputs, labels, ttl, timeout, expires_at, idempotency_key, spec_hash, reason,
    started_at
)
SELECT
    x.job_id, x.status, x.actions, x.resource, x.priority, x.max_attempts, now(), x.parent_id,
    x.is_parent, x.inputs, coalesce(x.labels, '{}'::jsonb),
    make_interval(secs => x.ttl_seconds), make_interval(secs => x.timeout_seconds),
    now() + make_interval(secs => x.expires_in_seconds),
    x.idempotency_key, x.spec_hash, x.reason,
    CASE WHEN x.status = 'running' THEN now() END
FROM jsonb_to_recordset(%(jobs)s::jsonb) AS x (
    job_id uuid, status text, actions jsonb, resource text, priority integer,
    max_attempts integer, parent_id uuid, is_parent boolean, inputs jsonb, labels jsonb,
    ttl_seconds float8, timeout_seconds float8, expires_in_seconds float8,
    idempotency_key text, spec_hash text, reason text
)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING job_id;

-- job_get_by_idempotency_keys --
-- Jobs already enqueued under these idempotency keys.
SELECT job_id, idempotency_key, spec_hash, status
FROM jobs WHERE idempotency_key = ANY(%(keys)s::text[]);

-- dependency_status --
-- The jobs that new jobs will wait on, with their status: a plain read, never a lock, so
-- that an enqueue never holds up a running dependency's heartbeats.
SELECT job_id, status FROM jobs WHERE job_id = ANY(%(job_ids)s::uuid[]);

-- dependency_insert_many --
-- Record `after` dependencies of new jobs.
INSERT INTO job_dependencies (job_id, depends_on)
SELECT x.job_id, x.depends_on
FROM jsonb_to_recordset(%(deps)s::jsonb) AS x (job_id uuid, depends_on uuid)
ON CONFLICT DO NOTHING;

-- job_claim --
-- Claim up to %(limit)s ready jobs in one statement: fresh fence, lease, attempt_count + 1.
-- SKIP LOCKED lets concurrent claimers pass each other; drain mode claims nothing.
WITH candidate AS (
    SELECT job_id FROM jobs
    WHERE status = 'pending' AND visible_at <= now()
      AND NOT (SELECT draining FROM jobfence_control)
    ORDER BY priority DESC, visible_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET
    status = 'running',
    attempt_id = gen_random_uuid(),
    attempt_count = j.attempt_count + 1,
    claimed_by = %(worker_id)s,
    claimed_at = now(),
    heartbeat_at = now(),
    visible_at = now() + make_interval(secs => %(lease_seconds)s),
    run_deadline_at = now() + j.timeout,
    started_at = coalesce(j.started_at, now()),
    reason = 'claimed by ' || %(worker_id)s
FROM candidate c
WHERE j.job_id = c.job_id AND j.attempt_count < j.max_attempts
RETURNING j.job_id, j.attempt_id, j.attempt_count, j.max_attempts, j.actions, j.inputs,
    j.parent_id, j.visible_at AS lease_expires_at, j.run_deadline_at, j.interruptions;

-- attempt_heartbeat --
-- Renew the lease of a live attempt. No row back: the fence is lost (cancelled, reclaimed,
-- timed out, or the lease already ran out).
UPDATE jobs SET
    visible_at = now() + make_interval(secs => %(lease_seconds)s),
    heartbeat_at = now()
WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
  AND status = 'running' AND visible_at > clock_timestamp()
RETURNING visible_at AS lease_expires_at;

-- attempt_action_record --
-- Record one action's result under the fence. FOR SHARE makes a concurrent rotation of the
-- fence either wait for this insert or make it match nothing. Idempotent, so a write retried
-- after a dropped connection is harmless.
WITH fence AS (
    SELECT job_id, attempt_id FROM jobs
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = 'running' AND visible_at > clock_timestamp()
    FOR SHARE
)
INSERT INTO job_action_results (
    job_id, attempt_id, action_index, name, status, started_at, result, error, error_detail
)
SELECT f.job_id, f.attempt_id, %(action_index)s, %(name)s, %(status)s, %(started_at)s,
    %(result)s, %(error)s, %(error_detail)s
FROM fence f
ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
    status = excluded.status, result = excluded.result, error = excluded.error,
    error_detail = excluded.error_detail, finished_at = excluded.finished_at
RETURNING action_index;

-- attempt_finish --
-- Terminal write by the holder of the fence (succeeded or failed), and the last action's
-- outcome when one is given, in one statement: the outcome is recorded only if the fenced
-- write matched.
WITH written AS (
    UPDATE jobs SET
        status = %(status)s,
        finished_at = now(),
        retain_until = now() + ttl,
        run_deadline_at = NULL,
        reason = %(reason)s,
        error = %(error)s,
        error_detail = %(error_detail)s
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = 'running' AND visible_at > clock_timestamp()
    RETURNING job_id, status, parent_id
), recorded AS (
    INSERT INTO job_action_results (
        job_id, attempt_id, action_index, name, status, started_at, result, error, error_detail
    )
    SELECT w.job_id, %(attempt_id)s, %(action_index)s, %(action_name)s, %(action_status)s,
        %(action_started_at)s, %(action_result)s, %(action_error)s, %(action_error_detail)s
    FROM written w
    WHERE %(action_index)s::integer IS NOT NULL
    ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
        status = excluded.status, result = excluded.result, error = excluded.error,
        error_detail = excluded.error_detail, finished_at = excluded.finished_at
)
SELECT job_id, status, parent_id FROM written;

-- attempt_release --
-- The holder gives the job back — pending after a delay while attempts remain, else
-- failed — with the failed action's outcome when given, in one statement. A retry drops
-- the fence; a terminal failure keeps it (this attempt wrote it).
WITH written AS (
    UPDATE jobs j SET
        status = CASE WHEN j.attempt_count >= j.max_attempts THEN 'failed' ELSE 'pending' END,
        attempt_id = CASE WHEN j.attempt_count >= j.max_attempts THEN j.attempt_id END,
        visible_at = now()
            + jobfence_retry_delay(j.attempt_count, %(base_seconds)s, %(cap_seconds)s),
        finished_at = CASE WHEN j.attempt_count >= j.max_attempts THEN now() END,
        retain_until = CASE WHEN j.attempt_count >= j.max_attempts THEN now() + j.ttl END,
        claimed_by = NULL,
        run_deadline_at = NULL,
        reason = %(reason)s,
        error = %(error)s,
        error_detail = %(error_detail)s
    WHERE j.job_id = %(job_id)s AND j.attempt_id = %(attempt_id)s
      AND j.status = 'running' AND j.visible_at > clock_timestamp()
    RETURNING j.job_id, j.status, j.parent_id
), recorded AS (
    INSERT INTO job_action_results (
        job_id, attempt_id, action_index, name, status, started_at, result, error, error_detail
    )
    SELECT w.job_id, %(attempt_id)s, %(action_index)s, %(action_name)s, %(action_status)s,
        %(action_started_at)s, %(action_result)s, %(action_error)s, %(action_error_detail)s
    FROM written w
    WHERE %(action_index)s::integer IS NOT NULL
    ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
        status = excluded.status, result = excluded.result, error = excluded.error,
        error_detail = excluded.error_detail, finished_at = excluded.finished_at
)
SELECT job_id, status, parent_id FROM written;

-- attempt_interrupt --
-- The holder gives the job back after SIGTERM (an eviction, a node drain: not the job's
-- fault): pending at once, and the attempt does not count — up to %(max_interruptions)s
-- interruptions; past them it counts as a failed attempt, so a job that is always
-- interrupted still ends. Fenced like every other write.
UPDATE jobs j SET
    status = CASE WHEN j.interruptions < %(max_interruptions)s
                    OR j.attempt_count < j.max_attempts THEN 'pending' ELSE 'failed' END,
    attempt_count = CASE WHEN j.interruptions < %(max_interruptions)s
                         THEN j.attempt_count - 1 ELSE j.attempt_count END,
    interruptions = j.interruptions + 1,
    attempt_id = CASE WHEN j.interruptions < %(max_interruptions)s
                        OR j.attempt_count < j.max_attempts THEN NULL ELSE j.attempt_id END,
    visible_at = now(),
    finished_at = CASE WHEN j.interruptions >= %(max_interruptions)s
                        AND j.attempt_count >= j.max_attempts THEN now() END,
    retain_until = CASE WHEN j.interruptions >= %(max_interruptions)s
                         AND j.attempt_count >= j.max_attempts THEN now() + j.ttl END,
    claimed_by = NULL,
    run_deadline_at = NULL,
    reason = %(reason)s,
    error = %(reason)s
WHERE j.job_id = %(job_id)s AND j.attempt_id = %(attempt_id)s
  AND j.status = 'running' AND j.visible_at > clock_timestamp()
RETURNING j.job_id, j.status, j.parent_id;

-- job_cancel_children --
-- Cancel a parent's unfinished children (fences rotated). Runs before job_cancel, in the same
-- transaction: children before parent, the order a finishing child takes too.
UPDATE jobs SET
    status = 'cancelled',
    attempt_id = NULL,
    claimed_by = NULL,
    run_deadline_at = NULL,
    finished_at = now(),
    retain_until = now() + ttl,
    reason = %(reason)s,
    error = %(reason)s
WHERE parent_id = %(job_id)s AND status IN ('waiting', 'pending', 'running')
RETURNING job_id, status, parent_id;

-- job_cancel --
-- Cancel a job that is not terminal yet; rotates the fence.
UPDATE jobs SET
    status = 'cancelled',
    attempt_id = NULL,
    claimed_by = NULL,
    run_deadline_at = NULL,
    finished_at = now(),
    retain_until = now() + ttl,
    reason = %(reason)s,
    error = %(reason)s
WHERE job_id = %(job_id)s AND status IN ('waiting', 'pending', 'running')
RETURNING job_id, status, parent_id;

-- lease_reclaim_expired --
-- Expired leases, oldest first, in a bounded batch: rotate the fence, then back to pending
-- with backoff, or failed once attempts are exhausted (jobfence_reclaim).
WITH expired AS (
    SELECT job_id, 'lease expired (claimed by ' || coalesce(claimed_by, '?') || ')' AS why
    FROM jobs
    WHERE status = 'running' AND NOT is_parent
      AND visible_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY visible_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
SELECT r.job_id, r.status, r.parent_id
FROM jobfence_reclaim(
    ARRAY(SELECT job_id FROM expired ORDER BY job_id),
    ARRAY(SELECT why FROM expired ORDER BY job_id),
    ARRAY(SELECT 'lease expired' FROM expired ORDER BY job_id),
    %(base_seconds)s, %(cap_seconds)s) AS r;

-- dependency_dependents --
-- Up to %(limit)s waiting jobs that depend on any of these jobs: an index probe per job
-- (most jobs have none), then one per dependency row until the limit (a job waiting on two
-- of them may come twice).
SELECT dep.job_id
FROM job_dependencies dep
WHERE dep.depends_on = ANY(%(job_ids)s::uuid[])
  AND (SELECT j.status FROM jobs j WHERE j.job_id = dep.job_id) = 'waiting'
LIMIT %(limit)s;

-- waiting_resolve --
-- Resolve waiting jobs whose dependencies allow it: pending (a parent: running) once every
-- dependency succeeded; failed, naming the dependency, as soon as one failed, was cancelled
-- or is gone. Jobs with a dependency still active stay waiting. Written as index probes per
-- given job and per dependency (LATERAL and a scalar subquery), so that a batch costs the
-- same however many jobs wait in the table: a hash join over the whole table per batch made
-- paging through 100k dependents quadratic.
WITH verdict AS (
    SELECT ids.job_id, v.active, v.failure
    FROM unnest(%(job_ids)s::uuid[]) AS ids (job_id)
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE s.status IN ('waiting', 'pending', 'running')) AS active,
            min(CASE
                WHEN s.status IS NULL THEN 'dependency ' || dep.depends_on || ' missing'
                WHEN s.status IN ('failed', 'cancelled')
                    THEN 'dependency ' || dep.depends_on || ' ' || s.status
            END) AS failure,
            count(*) AS deps
        FROM job_dependencies dep
        CROSS JOIN LATERAL (SELECT (SELECT d.status FROM jobs d
                                    WHERE d.job_id = dep.depends_on) AS status) s
        WHERE dep.job_id = ids.job_id
    ) v
    WHERE v.deps > 0
)
UPDATE jobs j SET
    status = CASE WHEN v.failure IS NOT NULL THEN 'failed'
                  WHEN j.is_parent THEN 'running' ELSE 'pending' END,
    visible_at = now(),
    finished_at = CASE WHEN v.failure IS NOT NULL THEN now() END,
    retain_until = CASE WHEN v.failure IS NOT NULL THEN now() + j.ttl END,
    started_at = CASE WHEN v.failure IS NULL AND j.is_parent THEN now() END,
    reason = coalesce(v.failure, 'dependencies succeeded'),
    error = v.failure
FROM verdict v
WHERE j.job_id = v.job_id AND j.status = 'waiting' AND (v.failure IS NOT NULL OR v.active = 0)
RETURNING j.job_id, j.status, j.parent_id, j.is_parent;

-- children_release --
-- A parent whose dependencies succeeded: its waiting children become claimable.
UPDATE jobs SET status = 'pending', visible_at = now(), reason = 'parent started'
WHERE parent_id = ANY(%(parent_ids)s::uuid[]) AND status = 'waiting'
RETURNING job_id, status, parent_id;

-- children_cancel_with_parent --
-- A parent that failed before starting: its waiting children will never run.
UPDATE jobs SET status = 'cancelled', finished_at = now(), retain_until = now() + ttl,
    reason = 'parent failed before starting', error = 'parent failed before starting'
WHERE parent_id = ANY(%(parent_ids)s::uuid[]) AND status = 'waiting'
RETURNING job_id, status, parent_id;

-- attempt_outputs_register --
-- Register output files before uploading them (status running), under the fence:
-- Falconeri's ownership check, done by the database. Idempotent.
WITH fence AS (
    SELECT job_id, attempt_id FROM jobs
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = 'running' AND visible_at > clock_timestamp()
    FOR SHARE
)
INSERT INTO job_outputs (job_id, attempt_id, path, url, status)
SELECT f.job_id, f.attempt_id, x.path, x.url, 'running'
FROM fence f, jsonb_to_recordset(%(outputs)s::jsonb) AS x (path text, url text)
ON CONFLICT (job_id, attempt_id, path) DO UPDATE SET
    status = 'running', url = excluded.url, error = NULL, updated_at = clock_timestamp()
RETURNING path;

-- attempt_outputs_confirm --
-- Confirm uploaded outputs (done, or error with why), under the fence.
WITH fence AS (
    SELECT job_id, attempt_id FROM jobs
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = 'running' AND visible_at > clock_timestamp()
    FOR SHARE
)
UPDATE job_outputs o SET
    status = x.status, size_bytes = x.size_bytes, error = x.error,
    updated_at = clock_timestamp()
FROM fence f, jsonb_to_recordset(%(outputs)s::jsonb)
    AS x (path text, status text, size_bytes bigint, error text)
WHERE o.job_id = f.job_id AND o.attempt_id = f.attempt_id AND o.path = x.path
RETURNING o.path;

-- parents_ready --
-- Running parents, after %(after)s in id order, whose children are all terminal.
SELECT p.job_id FROM jobs p
WHERE p.is_parent AND p.status = 'running' AND p.job_id > %(after)s
  AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.job_id
                  AND c.status IN ('waiting', 'pending', 'running'))
ORDER BY p.job_id
LIMIT %(limit)s;

-- parent_has_active_children --
-- Whether a parent still has a child that is not terminal (one index probe).
SELECT EXISTS (SELECT 1 FROM jobs WHERE parent_id = %(parent_id)s
               AND status IN ('waiting', 'pending', 'running')) AS active;

-- parent_children_page --
-- One page of a parent's children with their committed outputs: the winning attempt's
-- confirmed files, and only for a child that succeeded.
SELECT c.job_id, c.status, c.attempt_id, c.inputs, c.error,
    ARRAY(SELECT o.url FROM job_outputs o
          WHERE c.status = 'succeeded' AND o.job_id = c.job_id
            AND o.attempt_id = c.attempt_id AND o.status = 'done'
          ORDER BY o.path) AS outputs
FROM jobs c
WHERE c.parent_id = %(parent_id)s AND c.job_id > %(after)s
ORDER BY c.job_id
LIMIT %(limit)s;

-- parent_first_errors --
-- The first few children that did not succeed, for the parent's error message.
SELECT job_id, status, error FROM jobs
WHERE parent_id = %(parent_id)s AND status IN ('failed', 'cancelled')
ORDER BY job_id
LIMIT %(limit)s;

-- parent_finalize --
-- The one finalization of a parent: only while it is running and every child is terminal,
-- so however many finishers race, one UPDATE matches.
UPDATE jobs p SET
    status = %(status)s,
    manifest = %(manifest)s,
    finished_at = now(),
    retain_until = now() + p.ttl,
    reason = %(reason)s,
    error = %(error)s
WHERE p.job_id = %(job_id)s AND p.is_parent AND p.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.job_id
                  AND c.status IN ('waiting', 'pending', 'running'))
RETURNING p.job_id, p.status, p.parent_id;

-- waiting_page --
-- Waiting top-level jobs after %(after)s in id order (the safety net re-checks them).
SELECT job_id FROM jobs
WHERE status = 'waiting' AND parent_id IS NULL AND job_id > %(after)s
ORDER BY job_id
LIMIT %(limit)s;

-- lifecycle_timeout_reclaim --
-- Running jobs past their run deadline, oldest first, in a bounded batch: rotate the fence
-- (the worker finds out at its next heartbeat and kills its child), then back to pending
-- with backoff, or failed "timed out" once attempts are exhausted (jobfence_reclaim). The
-- timed-out attempt was counted at its claim, so it counts as a failed one.
WITH overdue AS (
    SELECT job_id, 'timed out: ran longer than its timeout (attempt ' || attempt_count
        || ' of ' || max_attempts || ', claimed by ' || coalesce(claimed_by, '?') || ')' AS why
    FROM jobs
    WHERE status = 'running' AND run_deadline_at IS NOT NULL AND NOT is_parent
      AND run_deadline_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY run_deadline_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
SELECT r.job_id, r.status, r.parent_id
FROM jobfence_reclaim(
    ARRAY(SELECT job_id FROM overdue ORDER BY job_id),
    ARRAY(SELECT why FROM overdue ORDER BY job_id),
    ARRAY(SELECT 'timed out' FROM overdue ORDER BY job_id),
    %(base_seconds)s, %(cap_seconds)s) AS r;

-- lifecycle_expire_pending --
-- Waiting or pending jobs past their expires_at, in a bounded batch: cancelled "expired
-- before start". Never claimed, so there is no fence to rotate.
WITH expired AS (
    SELECT job_id FROM jobs
    WHERE status IN ('waiting', 'pending') AND expires_at IS NOT NULL
      AND expires_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET
    status = 'cancelled',
    finished_at = now(),
    retain_until = now() + j.ttl,
    reason = 'expired before start',
    error = 'expired before start'
FROM expired e
WHERE j.job_id = e.job_id
RETURNING j.job_id, j.status, j.parent_id, j.is_parent;

-- children_cancel_expired_parent --
-- Parents that expired while waiting: their waiting children will never run. Same
-- transaction as the parents' expiry, so no child is left waiting on a cancelled parent.
UPDATE jobs SET status = 'cancelled', finished_at = now(), retain_until = now() + ttl,
    reason = 'parent expired before start', error = 'parent expired before start'
WHERE parent_id = ANY(%(parent_ids)s::uuid[]) AND status = 'waiting'
RETURNING job_id, status, parent_id;

-- retention_ttl_page --
-- Top-level terminal jobs with a ttl whose retain_until has passed, in (retain_until,
-- job_id) order after a cursor (a job whose objects could not be deleted stays behind it
-- until the next pass; the first page starts at the year 1). has_outputs: whether an
-- attempt registered an output, i.e. whether the job can own objects under its prefix
-- (one index probe per row: LIMIT 1 in a lateral join is never turned into a hash of the
-- whole job_outputs table).
SELECT j.job_id, j.is_parent, j.retain_until AS due,
    o.found IS NOT NULL AS has_outputs
FROM jobs j
LEFT JOIN LATERAL (SELECT true AS found FROM job_outputs o
                   WHERE o.job_id = j.job_id LIMIT 1) o ON true
WHERE j.parent_id IS NULL AND j.retain_until IS NOT NULL
  AND j.retain_until <= coalesce(%(now)s::timestamptz, now())
  AND j.status IN ('succeeded', 'failed', 'cancelled')
  AND (j.retain_until, j.job_id) > (%(after_due)s::timestamptz, %(after_id)s::uuid)
ORDER BY j.retain_until, j.job_id
LIMIT %(limit)s;

-- retention_default_page --
-- Top-level terminal jobs without a ttl that finished more than the default retention ago,
-- in (finished_at, job_id) order after a cursor; as retention_ttl_page otherwise.
SELECT j.job_id, j.is_parent, j.finished_at AS due,
    o.found IS NOT NULL AS has_outputs
FROM jobs j
LEFT JOIN LATERAL (SELECT true AS found FROM job_outputs o
                   WHERE o.job_id = j.job_id LIMIT 1) o ON true
WHERE j.parent_id IS NULL AND j.ttl IS NULL AND j.finished_at IS NOT NULL
  AND j.finished_at <= coalesce(%(now)s::timestamptz, now())
                       - make_interval(secs => %(retention_seconds)s)
  AND j.status IN ('succeeded', 'failed', 'cancelled')
  AND (j.finished_at, j.job_id) > (%(after_due)s::timestamptz, %(after_id)s::uuid)
ORDER BY j.finished_at, j.job_id
LIMIT %(limit)s;

-- retention_children_page --
-- One page of a parent's children in id order, each with whether it registered outputs.
SELECT c.job_id,
    o.found IS NOT NULL AS has_outputs
FROM jobs c
LEFT JOIN LATERAL (SELECT true AS found FROM job_outputs o
                   WHERE o.job_id = c.job_id LIMIT 1) o ON true
WHERE c.parent_id = %(parent_id)s AND c.job_id > %(after)s
ORDER BY c.job_id
LIMIT %(limit)s;

-- retention_children_delete --
-- Delete one bounded batch of a terminal parent's terminal children (their action results
-- and outputs cascade: a few rows per child).
DELETE FROM jobs
WHERE job_id IN (
    SELECT c.job_id FROM jobs c
    WHERE c.parent_id = %(parent_id)s AND c.status IN ('succeeded', 'failed', 'cancelled')
    ORDER BY c.job_id
    LIMIT %(limit)s
)
RETURNING job_id;

-- retention_jobs_delete --
-- Delete top-level terminal jobs whose objects are gone. A parent goes only once it has no
-- child left (its children are deleted first, batch by batch): the parent_id cascade never
-- deletes an unbounded number of children in one statement.
DELETE FROM jobs j
WHERE j.job_id = ANY(%(job_ids)s::uuid[]) AND j.parent_id IS NULL
  AND j.status IN ('succeeded', 'failed', 'cancelled')
  AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = j.job_id)
RETURNING j.job_id;

-- events_delete_expired --
-- Delete one bounded batch of audit events older than the audit retention, oldest first.
DELETE FROM job_events
WHERE event_id IN (
    SELECT event_id FROM job_events
    WHERE at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention_seconds)s)
    ORDER BY at
    LIMIT %(limit)s
);

-- function_runs_delete_expired --
-- Delete one bounded batch of function-run records older than their retention.
DELETE FROM function_runs
WHERE run_id IN (
    SELECT run_id FROM function_runs
    WHERE started_at < coalesce(%(now)s::timestamptz, now())
                       - make_interval(secs => %(retention_seconds)s)
    ORDER BY started_at
    LIMIT %(limit)s
);

-- job_get --
-- One job, everything `status` shows.
SELECT job_id, status, actions, resource, priority, max_attempts, attempt_count, visible_at,
    attempt_id, claimed_by, claimed_at, heartbeat_at, run_deadline_at, parent_id, is_parent,
    inputs, labels, ttl, timeout, expires_at, idempotency_key, reason, error, error_detail,
    manifest, created_at, started_at, finished_at, interruptions,
    ARRAY(SELECT depends_on FROM job_dependencies d WHERE d.job_id = jobs.job_id) AS after
FROM jobs WHERE job_id = %(job_id)s;

-- job_list --
-- Newest first (job ids are time-ordered), optionally by status and resource.
SELECT job_id, status, actions, resource, priority, max_attempts, attempt_count, visible_at,
    attempt_id, claimed_by, claimed_at, heartbeat_at, run_deadline_at, parent_id, is_parent,
    inputs, labels, ttl, timeout, expires_at, idempotency_key, reason, error, error_detail,
    manifest, created_at, started_at, finished_at, interruptions,
    ARRAY(SELECT depends_on FROM job_dependencies d WHERE d.job_id = jobs.job_id) AS after
FROM jobs
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(resource)s::text IS NULL OR resource = %(resource)s)
  AND (%(parent_id)s::uuid IS NULL OR parent_id = %(parent_id)s)
ORDER BY job_id DESC
LIMIT %(limit)s;

-- job_fence_get --
-- Where a job's fence stands (after a write whose outcome was lost with the connection).
SELECT status, attempt_id, reason FROM jobs WHERE job_id = %(job_id)s;

-- job_action_results --
-- Every recorded action result of some jobs, oldest first.
SELECT job_id, attempt_id, action_index, name, status, started_at, finished_at, result, error
FROM job_action_results
WHERE job_id = ANY(%(job_ids)s::uuid[])
ORDER BY job_id, finished_at, action_index;

-- job_children_counts --
-- A parent's children by status.
SELECT status, count(*) AS n FROM jobs WHERE parent_id = %(job_id)s GROUP BY status;

-- job_events --
-- The audit trail of one job.
SELECT event_id, from_status, to_status, attempt_id, reason, at
FROM job_events WHERE job_id = %(job_id)s ORDER BY event_id;

-- jobs_running_count --
-- Live claims (drain status: how many jobs still run).
SELECT count(*) AS n FROM jobs WHERE status = 'running' AND NOT is_parent;

-- lock_try --
-- Take a session-level advisory lock if it is free.
SELECT pg_try_advisory_lock(%(namespace)s, %(key)s) AS ok;

-- lock_wait --
-- Take a session-level advisory lock, waiting for it.
SELECT pg_advisory_lock(%(namespace)s, %(key)s);

-- lock_release --
-- Release a session-level advisory lock.
SELECT pg_advisory_unlock(%(namespace)s, %(key)s);

-- migrations_table_create --
-- Bookkeeping of applied migrations (created before anything else).
CREATE TABLE IF NOT EXISTS jobfence_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- migrations_applied --
-- Versions already applied.
SELECT version, name, applied_at FROM jobfence_schema_migrations ORDER BY version;

-- migration_record --
-- Mark a migration applied (same transaction as the migration itself).
INSERT INTO jobfence_schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- queue_keda_count --
-- The KEDA ScaledJob's postgresql trigger (manifests/ embeds this same text). KEDA's default
-- scaling strategy starts ceil(value / target) minus the Jobs already running, so the value
-- counts ready work plus live claims; 0 while draining. Two partial-index scans, however
-- many finished jobs the table holds.
SELECT CASE WHEN (SELECT draining FROM jobfence_control) THEN 0
    ELSE (SELECT count(*) FROM jobs WHERE status = 'pending' AND visible_at <= now())
       + (SELECT count(*) FROM jobs WHERE status = 'running' AND NOT is_parent)
    END AS value;

-- function_run_start --
-- A periodic function's run begins (status running, or skipped when another run holds its
-- lock).
INSERT INTO function_runs (function, trigger, status, host, finished_at)
VALUES (%(function)s, %(trigger)s, %(status)s, %(host)s,
        CASE WHEN %(status)s = 'skipped' THEN now() END)
RETURNING run_id;

-- function_run_finish --
-- A periodic function's run ends, with its counts.
UPDATE function_runs SET status = %(status)s, finished_at = now(), counts = %(counts)s,
    error = %(error)s
WHERE run_id = %(run_id)s;

-- function_totals_add --
-- Add a run's counts (and one to its runs-by-status counter) to the function's totals.
INSERT INTO function_totals (function, item, total)
SELECT %(function)s, t.key, t.value::numeric FROM jsonb_each_text(%(totals)s::jsonb) AS t
ON CONFLICT (function, item) DO UPDATE SET total = function_totals.total + excluded.total;

-- function_status_set --
-- The function's last run; the last success is kept across failed runs.
INSERT INTO function_status (function, last_run_at, last_status, last_trigger,
    last_duration_seconds, last_success_at)
VALUES (%(function)s, now(), %(status)s, %(trigger)s, %(duration)s,
        CASE WHEN %(status)s = 'succeeded' THEN now() END)
ON CONFLICT (function) DO UPDATE SET
    last_run_at = excluded.last_run_at, last_status = excluded.last_status,
    last_trigger = excluded.last_trigger,
    last_duration_seconds = excluded.last_duration_seconds,
    last_success_at = coalesce(excluded.last_success_at, function_status.last_success_at);

-- function_status_get --
-- Every function's last run (or one function's).
SELECT function, last_run_at, last_status, last_trigger, last_duration_seconds,
    last_success_at
FROM function_status
WHERE %(function)s::text IS NULL OR function = %(function)s
ORDER BY function;

-- function_totals_get --
-- Every function's totals (or one function's).
SELECT function, item, total FROM function_totals
WHERE %(function)s::text IS NULL OR function = %(function)s
ORDER BY function, item;

-- queue_gauges --
-- The queue at a glance, each part an index scan: active jobs by status (top-level waiting
-- jobs; children wait on their parent), the age of the oldest ready job, drain mode.
SELECT
    (SELECT count(*) FROM jobs WHERE status = 'waiting' AND parent_id IS NULL) AS waiting,
    (SELECT count(*) FROM jobs WHERE status = 'pending') AS pending,
    (SELECT count(*) FROM jobs WHERE status = 'running' AND NOT is_parent) AS running,
    (SELECT coalesce(extract(epoch FROM now() - min(visible_at)), 0)::float8 FROM jobs
     WHERE status = 'pending' AND visible_at <= now()) AS oldest_ready_age_seconds,
    (SELECT draining FROM jobfence_control) AS draining;

-- cluster_snapshot_create --
-- A session-local table for one pass's view of the worker pods, filled page by page, so
-- that the comparison with the claims runs in the database and the pass holds one page.
CREATE TEMPORARY TABLE IF NOT EXISTS cluster_pods (
    name       text PRIMARY KEY,
    phase      text NOT NULL,
    created_at timestamptz,
    started_at timestamptz,
    job_name   text,
    deleting   boolean NOT NULL
);

-- cluster_snapshot_clear --
-- Empty the snapshot before a new listing.
TRUNCATE pg_temp.cluster_pods;

-- cluster_snapshot_add --
-- Add one page of listed pods to the snapshot (a pod listed twice keeps its last state).
INSERT INTO pg_temp.cluster_pods (name, phase, created_at, started_at, job_name, deleting)
SELECT x.name, x.phase, x.created_at, x.started_at, x.job_name, x.deleting
FROM jsonb_to_recordset(%(pods)s::jsonb) AS x (
    name text, phase text, created_at timestamptz, started_at timestamptz, job_name text,
    deleting boolean)
ON CONFLICT (name) DO UPDATE SET phase = excluded.phase, created_at = excluded.created_at,
    started_at = excluded.started_at, job_name = excluded.job_name,
    deleting = excluded.deleting;

-- clock_now --
-- The database's clock, or the injected one: when a listing began.
SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now;

-- claims_dead_reclaim --
-- Live claims whose worker pod is gone from the snapshot, or has finished or gone Unknown,
-- in a bounded batch: rotate the fence, retry with backoff, or fail once attempts are
-- exhausted (jobfence_reclaim). Judged only for claimers the cluster can vouch for, and
-- only for claims made before the listing began minus a grace period; a pod that started
-- after the claim is a new process under a reused name, so the claimer is gone.
WITH dead AS (
    SELECT j.job_id,
        (p.name IS NULL OR p.started_at > j.claimed_at + interval '1 second') AS missing,
        CASE WHEN p.name IS NULL OR p.started_at > j.claimed_at + interval '1 second'
             THEN 'worker pod ' || j.claimed_by || ' disappeared'
             ELSE 'worker pod ' || j.claimed_by || ' is ' || p.phase END AS why
    FROM jobs j LEFT JOIN pg_temp.cluster_pods p ON p.name = j.claimed_by
    WHERE j.status = 'running' AND NOT j.is_parent
      AND j.claimed_by ~ %(claimer_pattern)s
      AND j.claimed_at < %(listed_at)s::timestamptz - make_interval(secs => %(grace_seconds)s)
      AND (p.name IS NULL OR p.phase IN ('Succeeded', 'Failed', 'Unknown')
           OR p.started_at > j.claimed_at + interval '1 second')
    ORDER BY j.job_id
    LIMIT %(batch_size)s
    FOR UPDATE OF j SKIP LOCKED
)
SELECT r.job_id, r.status, r.parent_id, d.missing
FROM jobfence_reclaim(
    ARRAY(SELECT job_id FROM dead ORDER BY job_id),
    ARRAY(SELECT why FROM dead ORDER BY job_id),
    ARRAY(SELECT why FROM dead ORDER BY job_id),
    %(base_seconds)s, %(cap_seconds)s) AS r
JOIN dead d ON d.job_id = r.job_id;

-- claims_unverifiable_count --
-- Live claims by workers the cluster cannot vouch for (e.g. run by hand outside it).
SELECT count(*) AS n FROM jobs
WHERE status = 'running' AND NOT is_parent AND claimed_by !~ %(claimer_pattern)s;

-- cluster_pods_unclaimed --
-- Running worker pods in the snapshot, started before the grace period, holding no live
-- claim; a page in name order.
SELECT p.name, p.job_name FROM pg_temp.cluster_pods p
WHERE p.phase = 'Running' AND NOT p.deleting
  AND coalesce(p.started_at, p.created_at) < %(listed_at)s::timestamptz - make_interval(secs => %(grace_seconds)s)
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.status = 'running' AND NOT j.is_parent
                  AND j.claimed_by = p.name)
  AND p.name > %(after)s
ORDER BY p.name
LIMIT %(limit)s;

-- orphan_suspects_note --
-- Remember a page of unclaimed pods: first seen now, or seen again.
INSERT INTO orphan_pod_suspects (name, job_name, first_seen, last_seen)
SELECT x.name, x.job_name, %(listed_at)s, %(listed_at)s
FROM jsonb_to_recordset(%(pods)s::jsonb) AS x (name text, job_name text)
ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen, job_name = excluded.job_name
RETURNING name, job_name, first_seen;

-- orphan_suspects_forget --
-- Suspects not seen unclaimed by this pass (they claimed work, or are gone).
DELETE FROM orphan_pod_suspects WHERE last_seen < %(listed_at)s;

-- orphan_suspect_confirm --
-- Just before deleting a suspect: drop it from the suspects if it holds a live claim now.
DELETE FROM orphan_pod_suspects s
WHERE s.name = %(name)s
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.status = 'running' AND NOT j.is_parent
                  AND j.claimed_by = s.name)
RETURNING s.name;

-- cluster_pods_finished_beyond_history --
-- Finished worker pods older than the newest %(keep)s, holding no live claim (those are
-- reconciliation's), a page in name order.
WITH ranked AS (
    SELECT p.name, p.job_name, row_number() OVER (
        ORDER BY coalesce(p.started_at, p.created_at) DESC NULLS LAST, p.name) AS rn
    FROM pg_temp.cluster_pods p
    WHERE p.phase IN ('Succeeded', 'Failed') AND NOT p.deleting
)
SELECT r.name, r.job_name FROM ranked r
WHERE r.rn > %(keep)s AND r.name > %(after)s
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.status = 'running' AND NOT j.is_parent
                  AND j.claimed_by = r.name)
ORDER BY r.name
LIMIT %(limit)s;

-- objects_owners --
-- For a page of (job, attempt) pairs parsed from object keys under jobfence/: 'keep' for a
-- job's own files (no attempt: the manifest), the live claim's and the committed attempt's
-- outputs; 'garbage' for any other attempt's (fenced out, failed, cancelled); 'gone' when
-- the job no longer exists.
SELECT x.job_id, x.attempt_id,
    CASE WHEN j.job_id IS NULL THEN 'gone'
         WHEN x.attempt_id IS NULL THEN 'keep'
         WHEN j.attempt_id = x.attempt_id AND j.status IN ('running', 'succeeded')
             THEN 'keep'
         ELSE 'garbage' END AS verdict
FROM jsonb_to_recordset(%(pairs)s::jsonb) AS x (job_id uuid, attempt_id uuid)
LEFT JOIN jobs j ON j.job_id = x.job_id;
