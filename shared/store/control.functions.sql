-- Database functions of the installation's identity and the drain switch (store/control.py
-- runs them through control.sql).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- The installation's identity, for every role.
CREATE OR REPLACE FUNCTION {schema}.jobfence_identity()
RETURNS TABLE (installation text, identified_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT c.installation, c.identified_at FROM {schema}.jobfence_control c;
$$;

-- Switch drain mode on or off, recorded.
CREATE OR REPLACE FUNCTION {schema}.operator_set_drain(
    p_on boolean, p_reason text, p_actor text)
RETURNS TABLE (draining boolean, drain_changed_at timestamptz, drain_reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF p_on IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'drain must be switched on or off';
    END IF;
    INSERT INTO {schema}.control_events (actor, action, detail)
    VALUES (p_actor, CASE WHEN p_on THEN 'drain_on' ELSE 'drain_off' END,
            jsonb_build_object('reason', p_reason));
    RETURN QUERY
    UPDATE {schema}.jobfence_control c
    SET draining = p_on, drain_changed_at = now(), drain_reason = p_reason
    RETURNING c.draining, c.drain_changed_at, c.drain_reason;
END;
$$;
