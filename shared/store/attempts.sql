-- The life of one claim: the claim itself and every write fenced by its attempt_id.
-- Named statements, run by the method of the same name in store/attempts.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- claim_lock --
-- Before a claim from a queue that has a limit on running jobs: one claimer of that queue
-- at a time, until this transaction ends. The claim that follows is a new statement, so it
-- counts the running jobs with a snapshot taken after the previous claimer committed: two
-- claimers can never both see a free slot that only one of them may take. Queues without
-- a limit take no lock.
SELECT pg_advisory_xact_lock(%(namespace)s, %(key)s)
FROM {schema}.queues WHERE name = %(queue)s AND max_running IS NOT NULL;

-- claim --
-- Claim up to %(limit)s ready jobs of a queue in one statement: fresh fence, lease,
-- attempt_count + 1. SKIP LOCKED lets concurrent claimers pass each other; drain mode, or
-- the queue paused, claims nothing; a queue's limit caps how many may run at once (after
-- claim_lock, in the same transaction). The limit is not a constant, so the planner
-- guesses a tenth of the table for it: the update takes the candidates as an array, which
-- it always reads by primary key, never by hashing the whole table.
WITH candidate AS (
    SELECT job_id FROM {schema}.jobs
    WHERE status = 'pending' AND queue = %(queue)s AND visible_at <= now()
      AND NOT (SELECT draining FROM {schema}.jobfence_control)
      AND NOT coalesce((SELECT q.paused FROM {schema}.queues q WHERE q.name = %(queue)s),
                       false)
    ORDER BY priority DESC, visible_at
    LIMIT (SELECT CASE WHEN q.max_running IS NULL THEN %(limit)s
                       ELSE greatest(0, least(%(limit)s, q.max_running - (
                           SELECT count(*) FROM {schema}.jobs r
                           WHERE r.status = 'running' AND r.queue = %(queue)s
                             AND NOT r.is_parent))) END
           FROM (SELECT max(max_running) AS max_running FROM {schema}.queues
                 WHERE name = %(queue)s) q)
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs j SET
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
WHERE j.job_id = ANY(ARRAY(SELECT job_id FROM candidate))
  AND j.attempt_count < j.max_attempts
RETURNING j.job_id, j.attempt_id, j.attempt_count, j.max_attempts, j.actions, j.inputs,
    j.parent_id, j.visible_at AS lease_expires_at, j.run_deadline_at, j.interruptions;

-- heartbeat --
-- Renew the lease of a live attempt. No row back: the fence is lost (cancelled, reclaimed,
-- timed out, or the lease already ran out).
UPDATE {schema}.jobs SET
    visible_at = now() + make_interval(secs => %(lease_seconds)s),
    heartbeat_at = now()
WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
  AND status = 'running' AND visible_at > clock_timestamp()
RETURNING visible_at AS lease_expires_at;

-- record_action --
-- Record one action's result under the fence. FOR SHARE makes a concurrent rotation of the
-- fence either wait for this insert or make it match nothing. Idempotent, so a write retried
-- after a dropped connection is harmless.
WITH fence AS (
    SELECT job_id, attempt_id FROM {schema}.jobs
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = 'running' AND visible_at > clock_timestamp()
    FOR SHARE
)
INSERT INTO {schema}.job_action_results (
    job_id, attempt_id, action_index, name, status, started_at, result, error, error_detail
)
SELECT f.job_id, f.attempt_id, %(action_index)s, %(name)s, %(status)s, %(started_at)s,
    %(result)s, %(error)s, %(error_detail)s
FROM fence f
ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
    status = excluded.status, result = excluded.result, error = excluded.error,
    error_detail = excluded.error_detail, finished_at = excluded.finished_at
RETURNING action_index;

-- finish --
-- Terminal write by the holder of the fence (succeeded or failed), and the last action's
-- outcome when one is given, in one statement: the outcome is recorded only if the fenced
-- write matched.
WITH written AS (
    UPDATE {schema}.jobs SET
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
    INSERT INTO {schema}.job_action_results (
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

-- release --
-- The holder gives the job back — pending after a delay while attempts remain, else
-- failed — with the failed action's outcome when given, in one statement. A retry drops
-- the fence; a terminal failure keeps it (this attempt wrote it).
WITH written AS (
    UPDATE {schema}.jobs j SET
        status = CASE WHEN j.attempt_count >= j.max_attempts THEN 'failed' ELSE 'pending' END,
        attempt_id = CASE WHEN j.attempt_count >= j.max_attempts THEN j.attempt_id END,
        visible_at = now()
            + {schema}.jobfence_retry_delay(j.attempt_count, %(base_seconds)s, %(cap_seconds)s),
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
    INSERT INTO {schema}.job_action_results (
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

-- interrupt --
-- The holder gives the job back after SIGTERM (an eviction, a node drain: not the job's
-- fault): pending at once, and the attempt does not count — up to %(max_interruptions)s
-- interruptions; past them it counts as a failed attempt, so a job that is always
-- interrupted still ends. Fenced like every other write.
UPDATE {schema}.jobs j SET
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

-- register_outputs --
-- Register output files before uploading them (status running), under the fence:
-- Falconeri's ownership check, done by the database. Idempotent.
WITH fence AS (
    SELECT job_id, attempt_id FROM {schema}.jobs
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = 'running' AND visible_at > clock_timestamp()
    FOR SHARE
)
INSERT INTO {schema}.job_outputs (job_id, attempt_id, path, url, status)
SELECT f.job_id, f.attempt_id, x.path, x.url, 'running'
FROM fence f, jsonb_to_recordset(%(outputs)s::jsonb) AS x (path text, url text)
ON CONFLICT (job_id, attempt_id, path) DO UPDATE SET
    status = 'running', url = excluded.url, error = NULL, updated_at = clock_timestamp()
RETURNING path;

-- confirm_outputs --
-- Confirm uploaded outputs (done, or error with why), under the fence.
WITH fence AS (
    SELECT job_id, attempt_id FROM {schema}.jobs
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = 'running' AND visible_at > clock_timestamp()
    FOR SHARE
)
UPDATE {schema}.job_outputs o SET
    status = x.status, size_bytes = x.size_bytes, error = x.error,
    updated_at = clock_timestamp()
FROM fence f, jsonb_to_recordset(%(outputs)s::jsonb)
    AS x (path text, status text, size_bytes bigint, error text)
WHERE o.job_id = f.job_id AND o.attempt_id = f.attempt_id AND o.path = x.path
RETURNING o.path;

-- fence --
-- Where a job's fence stands (after a write whose outcome was lost with the connection).
SELECT status, attempt_id, reason FROM {schema}.jobs WHERE job_id = %(job_id)s;
