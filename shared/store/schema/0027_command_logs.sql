-- 0027: a command's whole output, kept on S3 beside the job's outputs (docs/DESIGN.md,
-- "A command's output").
--
-- * job_logs: one row per action of an attempt whose stdout and stderr went to S3 (more
--   than a tail's worth, or a command that ran long enough to be followed), registered
--   under the fence before its first object is written, as an output is. The objects'
--   keys follow from the row (JOB/logs/ATTEMPT/INDEX/STREAM/SEQUENCE under the
--   installation's prefix): nothing a worker writes names where a reader looks. How much
--   each stream held, and whether it was cut at JOBFENCE_OUTPUT_MAX_BYTES, is in the
--   action's result (stdout_bytes, stderr_bytes, output_truncated).
-- * worker_register_log: that registration; like every worker_* function it answers only
--   for the attempt holding the fence (NULL back otherwise: the worker writes nothing to
--   S3 then), and a repeated call is harmless.
-- Retention deletes a job's objects when one of its attempts registered an output or a
-- log (store/maintenance.sql); orphan-cleanup keeps them while their job exists.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

CREATE TABLE {schema}.job_logs (
    job_id       uuid NOT NULL REFERENCES {schema}.jobs (job_id) ON DELETE CASCADE,
    attempt_id   uuid NOT NULL,
    action_index integer NOT NULL CONSTRAINT job_logs_index CHECK (action_index >= 0),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, attempt_id, action_index)
);
