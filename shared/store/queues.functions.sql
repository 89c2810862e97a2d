-- Database functions of a queue's pause, limit and rate, each change recorded
-- (store/queues.py runs them through queues.sql).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- Pause, resume or limit a queue (the settings not given stay as they are), recorded.
CREATE OR REPLACE FUNCTION {schema}.operator_configure_queue(
    p_queue text, p_paused boolean, p_set_limit boolean, p_max_running integer, p_reason
    text, p_actor text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    name text;
BEGIN
    INSERT INTO {schema}.queues AS q (name, paused, max_running, reason, changed_at)
    VALUES (p_queue, coalesce(p_paused, false),
            CASE WHEN p_set_limit THEN p_max_running END, p_reason, now())
    ON CONFLICT ON CONSTRAINT queues_pkey DO UPDATE SET
        paused = coalesce(p_paused, q.paused),
        max_running = CASE WHEN p_set_limit THEN p_max_running ELSE q.max_running END,
        reason = coalesce(p_reason, q.reason),
        changed_at = now()
    RETURNING q.name INTO name;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, CASE WHEN p_set_limit THEN 'queue_limit'
                          WHEN p_paused THEN 'queue_pause' ELSE 'queue_resume' END,
            p_queue, jsonb_build_object('limit', p_max_running, 'reason', p_reason));
    RETURN name;
END;
$$;

-- Set (or, with NULLs, remove) a queue's rate, recorded with who asked.
CREATE OR REPLACE FUNCTION {schema}.operator_queue_rate(
    p_queue text, p_rate_limit integer, p_period_seconds float8, p_actor text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    name text;
    period interval := make_interval(secs => p_period_seconds);
BEGIN
    IF (p_rate_limit IS NULL) <> (p_period_seconds IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'a rate is a number of starts and a period, or none';
    END IF;
    IF p_rate_limit IS NOT NULL THEN
        PERFORM {schema}.jobfence_check_bounds('rate', p_rate_limit, 0, 1000000);
        PERFORM {schema}.jobfence_check_bounds('rate period', p_period_seconds, 1, 86400);
    END IF;
    INSERT INTO {schema}.queues AS q (name, rate_limit, rate_period, changed_at)
    VALUES (p_queue, p_rate_limit, period, now())
    ON CONFLICT ON CONSTRAINT queues_pkey DO UPDATE SET
        rate_limit = p_rate_limit, rate_period = period, changed_at = now()
    RETURNING q.name INTO name;
    IF p_rate_limit IS NULL THEN
        DELETE FROM {schema}.queue_starts s WHERE s.queue = p_queue;
    END IF;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, 'queue_rate', p_queue,
            jsonb_build_object('rate', p_rate_limit, 'period_seconds', p_period_seconds));
    RETURN name;
END;
$$;

-- Set a queue's limit on each group's running jobs (p_set_group_limit; NULL: none) or its
-- round-robin across groups (p_fair, when given), recorded. Turning round-robin on starts
-- it from the first group.
CREATE OR REPLACE FUNCTION {schema}.operator_queue_groups(
    p_queue text, p_set_group_limit boolean, p_group_limit integer, p_fair boolean,
    p_actor text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    name text;
BEGIN
    IF p_set_group_limit AND p_group_limit IS NOT NULL THEN
        PERFORM {schema}.jobfence_check_bounds('group limit', p_group_limit, 0, 1000000);
    END IF;
    INSERT INTO {schema}.queues AS q (name, group_limit, fair, changed_at)
    VALUES (p_queue, CASE WHEN p_set_group_limit THEN p_group_limit END,
            coalesce(p_fair, false), now())
    ON CONFLICT ON CONSTRAINT queues_pkey DO UPDATE SET
        group_limit = CASE WHEN p_set_group_limit THEN p_group_limit ELSE q.group_limit END,
        fair = coalesce(p_fair, q.fair),
        fair_cursor = CASE WHEN p_fair AND NOT q.fair THEN NULL ELSE q.fair_cursor END,
        changed_at = now()
    RETURNING q.name INTO name;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, CASE WHEN p_set_group_limit THEN 'queue_group_limit' ELSE 'queue_fair' END,
            p_queue, CASE WHEN p_set_group_limit
                          THEN jsonb_build_object('group_limit', p_group_limit)
                          ELSE jsonb_build_object('fair', p_fair) END);
    RETURN name;
END;
$$;
