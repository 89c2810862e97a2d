-- Jobs: inserting them, reading them, cancelling them.
-- Named statements, run by the method of the same name in store/jobs.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- insert_many --
-- Insert a batch of new jobs (a datum parent starts out running, never claimed); a repeated
-- idempotency key inserts nothing for that job. A scheduled job (run_at, or delay from now)
-- is not claimable before then: that is its visible_at. One row back, however large the
-- batch: the ids inserted of the jobs that have an idempotency key (every other job is
-- inserted or the statement fails), and whether every job that expires may start first,
-- by the database's clock (the caller refuses the batch when one may not). A field a job's
-- row leaves out is NULL (NewJob.row writes only what is set; what it adds, it ignores).
WITH inserted AS (
    INSERT INTO {schema}.jobs (
        job_id, status, actions, resource, priority, max_attempts, visible_at, parent_id,
        is_parent, inputs, labels, ttl, timeout, expires_at, idempotency_key, spec_hash,
        reason, started_at, queue, run_at, traceparent, group_key, workflow_id, step
    )
    SELECT
        x.job_id, x.status, x.actions, x.resource, x.priority, x.max_attempts,
        coalesce(s.run_at, now()), x.parent_id,
        x.is_parent, x.inputs, coalesce(x.labels, '{{}}'::jsonb),
        make_interval(secs => x.ttl_seconds), make_interval(secs => x.timeout_seconds),
        now() + make_interval(secs => x.expires_in_seconds),
        x.idempotency_key, x.spec_hash, 'enqueued',
        CASE WHEN x.status = 'running' THEN now() END, x.queue, s.run_at, x.traceparent,
        x.group_key, x.workflow_id, x.step
    FROM jsonb_to_recordset(%(jobs)s::jsonb) AS x (
        job_id uuid, status text, actions jsonb, resource text, priority integer,
        max_attempts integer, parent_id uuid, is_parent boolean, inputs jsonb, labels jsonb,
        ttl_seconds float8, timeout_seconds float8, expires_in_seconds float8,
        idempotency_key text, spec_hash text, queue text, run_at timestamptz,
        delay_seconds float8, traceparent text, group_key text, workflow_id uuid, step text
    )
    CROSS JOIN LATERAL (SELECT coalesce(x.run_at,
                                        now() + make_interval(secs => x.delay_seconds)) AS run_at) s
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING job_id, idempotency_key,
              (expires_at IS NULL OR run_at IS NULL OR expires_at > run_at) AS expires_late
)
SELECT coalesce(array_agg(job_id) FILTER (WHERE idempotency_key IS NOT NULL),
                '{{}}') AS keyed,
       coalesce(bool_and(expires_late), true) AS expires_late
FROM inserted;

-- by_idempotency_keys --
-- Jobs already enqueued under these idempotency keys.
SELECT job_id, idempotency_key, spec_hash, status
FROM {schema}.jobs WHERE idempotency_key = ANY(%(keys)s::text[]);

-- cancel --
-- Cancel a job that is not terminal yet, and a parent's unfinished children (fences
-- rotated; a running attempt kept as stopping until its worker confirms its command is
-- gone, and told now): operator_cancel. Refused (JF404, JF409) when there is no such job
-- or it has finished.
SELECT * FROM {schema}.operator_cancel(%(job_id)s::uuid, %(reason)s::text);

-- get --
-- One job, everything `status` shows.
SELECT job_id, status, actions, resource, priority, max_attempts, attempt_count, visible_at,
    attempt_id, claimed_by, claimed_at, heartbeat_at, run_deadline_at, parent_id, is_parent,
    inputs, labels, ttl, timeout, expires_at, idempotency_key, reason, error, error_detail,
    manifest, created_at, started_at, finished_at, interruptions, snoozes, queue, run_at,
    CASE WHEN stopping_until > clock_timestamp() THEN stopping_until END AS stopping_until,
    ARRAY(SELECT depends_on FROM {schema}.job_dependencies d WHERE d.job_id = jobs.job_id) AS after,
    run, group_key AS "group"
FROM {schema}.jobs WHERE job_id = %(job_id)s;

-- page --
-- Newest first (job ids are time-ordered), optionally by status, resource, parent, queue,
-- labels (the job's labels include these, never none: `labels <> '{}'` is jobs_labels'
-- predicate, for the planner); with `after`, only jobs older than that one (the next page:
-- keyset, by the primary key).
SELECT job_id, status, actions, resource, priority, max_attempts, attempt_count, visible_at,
    attempt_id, claimed_by, claimed_at, heartbeat_at, run_deadline_at, parent_id, is_parent,
    inputs, labels, ttl, timeout, expires_at, idempotency_key, reason, error, error_detail,
    manifest, created_at, started_at, finished_at, interruptions, snoozes, queue, run_at,
    CASE WHEN stopping_until > clock_timestamp() THEN stopping_until END AS stopping_until,
    ARRAY(SELECT depends_on FROM {schema}.job_dependencies d WHERE d.job_id = jobs.job_id) AS after,
    run, group_key AS "group"
FROM {schema}.jobs
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(resource)s::text IS NULL OR resource = %(resource)s)
  AND (%(parent_id)s::uuid IS NULL OR parent_id = %(parent_id)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(labels)s::jsonb IS NULL OR (labels @> %(labels)s::jsonb AND labels <> '{{}}'::jsonb))
  AND (%(after)s::uuid IS NULL OR job_id < %(after)s)
ORDER BY job_id DESC
LIMIT %(limit)s;

-- action_results --
-- Every recorded action result of some jobs, oldest first, each with its run.
SELECT job_id, attempt_id, action_index, name, status, started_at, finished_at, result, error,
    error_detail, run
FROM {schema}.job_action_results
WHERE job_id = ANY(%(job_ids)s::uuid[])
ORDER BY job_id, finished_at, action_index;

-- logged_actions --
-- The actions of one attempt whose output streams went to S3 (job_logs), in order.
SELECT action_index FROM {schema}.job_logs
WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s
ORDER BY action_index;

-- children_counts --
-- A parent's children by status.
SELECT status, count(*) AS n FROM {schema}.jobs WHERE parent_id = %(job_id)s GROUP BY status;

-- events --
-- The audit trail of one job (a claim's event with the attempt number it ran as).
SELECT event_id, from_status, to_status, attempt_id, reason, at, attempt
FROM {schema}.job_events WHERE job_id = %(job_id)s ORDER BY event_id;

-- watch --
-- Register a waiter on a job (one row per job, however many wait).
INSERT INTO {schema}.job_watchers (job_id) SELECT job_id FROM {schema}.jobs
WHERE job_id = %(job_id)s
ON CONFLICT (job_id) DO UPDATE SET since = now();

-- unwatch --
-- A waiter stops waiting.
DELETE FROM {schema}.job_watchers WHERE job_id = %(job_id)s;

-- retry --
-- A failed or cancelled job (not a parent, nor a child of a finished parent, nor one whose
-- cancelled attempt is still stopping) runs again: operator_retry. Its resource must be
-- free (the unique index decides); refused while draining.
SELECT * FROM {schema}.operator_retry(%(job_id)s::uuid, %(reason)s::text);

-- select_page --
-- A page of a bulk selection, newest first: jobs of one status, optionally by queue,
-- resource, parent, labels and a window of creation time; after `after` (keyset) and made
-- no later than `ceiling` (when the selection began, so a growing queue cannot move it).
SELECT job_id, status, queue FROM {schema}.jobs
WHERE status = %(status)s
  AND (%(resource)s::text IS NULL OR resource = %(resource)s)
  AND (%(parent_id)s::uuid IS NULL OR parent_id = %(parent_id)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(labels)s::jsonb IS NULL OR (labels @> %(labels)s::jsonb AND labels <> '{{}}'::jsonb))
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s)
  AND created_at <= %(ceiling)s::timestamptz
  AND (%(after)s::uuid IS NULL OR job_id < %(after)s)
ORDER BY job_id DESC
LIMIT %(limit)s;

-- select_count --
-- How many jobs of one status a bulk selection holds (counting stops at `cap`).
SELECT count(*) AS n FROM (
    SELECT 1 FROM {schema}.jobs
    WHERE status = %(status)s
      AND (%(resource)s::text IS NULL OR resource = %(resource)s)
      AND (%(parent_id)s::uuid IS NULL OR parent_id = %(parent_id)s)
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(labels)s::jsonb IS NULL
           OR (labels @> %(labels)s::jsonb AND labels <> '{{}}'::jsonb))
      AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s)
      AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s)
      AND created_at <= %(ceiling)s::timestamptz
    LIMIT %(cap)s
) s;

-- statuses_of --
-- The status of each of some jobs (an explicit selection).
SELECT job_id, status, queue FROM {schema}.jobs WHERE job_id = ANY(%(job_ids)s::uuid[])
ORDER BY job_id DESC;

-- retry_many --
-- Retry up to 1,000 jobs with operator_retry's rules, a refusal per job instead of an
-- error; refused as a whole while draining.
SELECT job_id, status, refusal
FROM {schema}.operator_retry_many(%(job_ids)s::uuid[], %(reason)s::text);

-- cancel_many --
-- Cancel up to 1,000 jobs (and their parents' unfinished children) with operator_cancel's
-- rules, a refusal per job instead of an error.
SELECT job_id, status, parent_id, refusal
FROM {schema}.operator_cancel_many(%(job_ids)s::uuid[], %(reason)s::text);

-- reveal_env --
-- A job's actions' env values, for an operator who asks: recorded with who and why.
SELECT {schema}.operator_reveal_env(%(job_id)s::uuid, %(actor)s::text, %(reason)s::text)
    AS env;

-- clock --
-- The database's clock: where a bulk selection's window ends.
SELECT clock_timestamp() AS now;
