-- 0026: a job carries the trace context it was enqueued in, so that its attempts and
-- actions join the application's trace (docs/DESIGN.md, "Traces").
--
-- * jobs.traceparent: the W3C `traceparent` of the enqueue's producer span (or, where the
--   enqueuing process does not trace, the one its caller gave), always in version 00's
--   form. A datum parent's children carry their parent's. NULL: enqueued without one.
--   The check is added NOT VALID: the column is new and NULL in every existing row, and a
--   validation would scan the whole table under the ALTER's lock for nothing.
-- * worker_trace: what a tracing worker reads once per attempt, apart from its claim: the
--   job's traceparent and the span id of the job's first attempt's span (a retry's span
--   links to it). An attempt's span id is derived from its attempt id (the first 8 bytes
--   of sha256('attempt', 0, the id's 16 bytes), as jobfence.tracing.attempt_span_id does):
--   the worker learns the span, never another attempt's id. Like every worker_* function it
--   answers only for the attempt that holds the fence, and never for a NULL one.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

ALTER TABLE {schema}.jobs ADD COLUMN traceparent text;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_traceparent_form
    CHECK (traceparent ~ '^00-[0-9a-f]{{32}}-[0-9a-f]{{16}}-[0-9a-f]{{2}}$') NOT VALID;
