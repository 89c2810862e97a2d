-- Database functions of traces: the trace context of an attempt (store/traces.py runs it
-- through traces.sql).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- The trace context of the attempt the worker holds: the job's traceparent and the span
-- id of this attempt's first span (derived from the attempt id).
CREATE OR REPLACE FUNCTION {schema}.worker_trace(p_job_id uuid, p_attempt_id uuid)
RETURNS TABLE (traceparent text, first_span_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT j.traceparent,
           (SELECT encode(substr(sha256('attempt'::bytea || '\x00'::bytea
                                        || uuid_send(e.attempt_id)), 1, 8), 'hex')
            FROM {schema}.job_events e
            WHERE e.job_id = j.job_id AND e.to_status = 'running' AND e.attempt_id IS NOT NULL
            ORDER BY e.event_id LIMIT 1)
    FROM {schema}.jobs j
    WHERE j.job_id = p_job_id AND p_attempt_id IS NOT NULL
      AND j.attempt_id = p_attempt_id AND j.status = 'running';
$$;
