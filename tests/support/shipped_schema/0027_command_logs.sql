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

CREATE TABLE {schema}.job_logs (
    job_id       uuid NOT NULL REFERENCES {schema}.jobs (job_id) ON DELETE CASCADE,
    attempt_id   uuid NOT NULL,
    action_index integer NOT NULL CONSTRAINT job_logs_index CHECK (action_index >= 0),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, attempt_id, action_index)
);

CREATE FUNCTION {schema}.worker_register_log(p_job_id uuid, p_attempt_id uuid,
                                            p_action_index integer)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    WITH fence AS (
        SELECT j.job_id, j.attempt_id FROM {schema}.jobs j
        WHERE j.job_id = p_job_id AND j.attempt_id = p_attempt_id
          AND j.status = 'running' AND j.visible_at > clock_timestamp()
          AND p_action_index BETWEEN 0 AND jsonb_array_length(j.actions) - 1
        FOR SHARE
    ), made AS (
        INSERT INTO {schema}.job_logs (job_id, attempt_id, action_index)
        SELECT f.job_id, f.attempt_id, p_action_index FROM fence f
        ON CONFLICT DO NOTHING
        RETURNING action_index
    )
    SELECT p_action_index FROM fence;
$$;
