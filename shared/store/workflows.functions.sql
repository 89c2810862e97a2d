-- Database functions of workflows: a submission's row, and its cancel and retry marks
-- (store/workflows.py runs them through workflows.sql). The steps are jobs, written and
-- moved by the jobs' own verbs.
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md).

-- A workflow's row, recorded with who submitted it; with a key already used, nothing is
-- written and the first workflow under it is answered (created false): the caller compares
-- its spec_hash. Runs in the enqueue's transaction, before its steps are inserted.
CREATE OR REPLACE FUNCTION {schema}.operator_workflow_add(
    p_workflow_id uuid, p_name text, p_key text, p_spec_hash text, p_steps integer,
    p_actor text)
RETURNS TABLE (workflow_id uuid, spec_hash text, created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF p_key IS NOT NULL THEN
        RETURN QUERY SELECT w.workflow_id, w.spec_hash, false FROM {schema}.workflows w
                     WHERE w.idempotency_key = p_key;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    INSERT INTO {schema}.workflows AS w (workflow_id, name, idempotency_key, spec_hash, steps,
                                         created_by)
    VALUES (p_workflow_id, p_name, p_key, p_spec_hash, p_steps, p_actor)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING w.workflow_id, w.spec_hash, true;
    IF NOT FOUND THEN  -- the same key committed meanwhile
        RETURN QUERY SELECT w.workflow_id, w.spec_hash, false FROM {schema}.workflows w
                     WHERE w.idempotency_key = p_key;
        RETURN;
    END IF;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, 'workflow_submit', p_workflow_id::text,
            jsonb_build_object('name', p_name, 'steps', p_steps, 'key', p_key));
END;
$$;

-- Mark a workflow cancelled (p_cancelled) or not (its retry), recorded with who asked and
-- why; the workflow's name back, JF404 when there is none. The steps are cancelled or
-- retried by the jobs' verbs, in the same transaction.
CREATE OR REPLACE FUNCTION {schema}.operator_workflow_mark(
    p_workflow_id uuid, p_cancelled boolean, p_actor text, p_reason text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    name text;
BEGIN
    UPDATE {schema}.workflows w
    SET cancelled_at = CASE WHEN p_cancelled THEN coalesce(w.cancelled_at, now()) END
    WHERE w.workflow_id = p_workflow_id
    RETURNING w.name INTO name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JF404', DETAIL = p_workflow_id::text,
            MESSAGE = format('workflow %s not found', p_workflow_id);
    END IF;
    INSERT INTO {schema}.control_events (actor, action, subject, detail)
    VALUES (p_actor, CASE WHEN p_cancelled THEN 'workflow_cancel' ELSE 'workflow_retry' END,
            p_workflow_id::text, jsonb_build_object('reason', p_reason));
    RETURN name;
END;
$$;

-- A workflow's state, derived from its steps' jobs: cancelled (marked so), failed (a step
-- failed or was cancelled: failed_step is the first that did so on its own, not for a
-- dependency), succeeded (every step), else running; and its steps by status. A table
-- function of one SELECT, without SET: inlined where it is used.
CREATE OR REPLACE FUNCTION {schema}.jobfence_workflow_state(p_workflow_id uuid,
                                                           p_cancelled_at timestamptz,
                                                           p_steps integer)
RETURNS TABLE (status text, failed_step text, steps_done integer, steps_failed integer,
               started_at timestamptz, finished_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_cancelled_at IS NOT NULL THEN 'cancelled'
                WHEN s.failed > 0 THEN 'failed'
                WHEN s.succeeded = p_steps THEN 'succeeded'
                ELSE 'running' END,
        CASE WHEN p_cancelled_at IS NULL AND s.failed > 0 THEN
            (SELECT f.step FROM {schema}.jobs f
             WHERE f.workflow_id = p_workflow_id AND f.status IN ('failed', 'cancelled')
               AND coalesce(f.error, '') NOT LIKE 'dependency %'
             ORDER BY f.finished_at, f.step LIMIT 1) END,
        s.succeeded, s.failed, s.started_at,
        CASE WHEN s.succeeded + s.failed = p_steps THEN s.finished_at END
    FROM (SELECT count(*) FILTER (WHERE j.status = 'succeeded')::integer AS succeeded,
                 count(*) FILTER (WHERE j.status IN ('failed', 'cancelled'))::integer AS failed,
                 min(j.started_at) AS started_at, max(j.finished_at) AS finished_at
          FROM {schema}.jobs j WHERE j.workflow_id = p_workflow_id) s;
$$;
