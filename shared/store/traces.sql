-- The trace context of an attempt (jobfence.tracing): read by a worker that traces, once
-- per attempt, apart from its claim.

-- for_attempt --
-- The job's traceparent (NULL: enqueued without one) and the span id of its first attempt's
-- span (16 hex digits), for the attempt that holds the fence; no row for any other attempt
-- (worker_trace).
SELECT traceparent, first_span_id
FROM {schema}.worker_trace(%(job_id)s::uuid, %(attempt_id)s::uuid);
