-- Database functions of the manual triggers of the periodic functions, one per interval,
-- audited (store/triggers.py runs them through triggers.sql).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- A manual trigger of a periodic function: take the function's slot when p_interval
-- seconds have passed since its last trigger, and record who and why; no row when the slot
-- is taken.
CREATE OR REPLACE FUNCTION {schema}.operator_trigger_request(
    p_function text, p_requested_by text, p_reason text, p_interval float8)
RETURNS SETOF {schema}.function_triggers
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    PERFORM {schema}.jobfence_check_bounds('interval', p_interval, 0, 86400);
    RETURN QUERY
    WITH slot AS (
        INSERT INTO {schema}.function_trigger_slots AS s (function, last_at)
        VALUES (p_function, clock_timestamp())
        ON CONFLICT ON CONSTRAINT function_trigger_slots_pkey DO UPDATE
        SET last_at = excluded.last_at
        WHERE s.last_at <= excluded.last_at - make_interval(secs => p_interval)
        RETURNING s.function, s.last_at
    )
    INSERT INTO {schema}.function_triggers AS t (function, requested_by, reason, requested_at)
    SELECT slot.function, p_requested_by, p_reason, slot.last_at FROM slot
    RETURNING t.*;
END;
$$;

-- The outcome of a requested trigger: the cluster created its Job (p_job_name), or refused
-- it (p_error: the slot is handed back). Only a trigger still `requested` changes.
CREATE OR REPLACE FUNCTION {schema}.operator_trigger_outcome(
    p_trigger_id bigint, p_job_name text, p_error text)
RETURNS SETOF {schema}.function_triggers
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH t AS (
        UPDATE {schema}.function_triggers t SET
            outcome = CASE WHEN p_error IS NULL THEN 'created' ELSE 'failed' END,
            job_name = p_job_name, error = p_error
        WHERE t.trigger_id = p_trigger_id AND t.outcome = 'requested'
        RETURNING t.*
    ), freed AS (
        UPDATE {schema}.function_trigger_slots s SET last_at = '-infinity'
        FROM t WHERE p_error IS NOT NULL AND s.function = t.function
          AND s.last_at = t.requested_at
    )
    SELECT * FROM t;
END;
$$;
