-- 0034: a retried job waits for its dependencies as an enqueue makes it wait; a snoozed
-- claim's output is kept; each claim's audit event keeps the attempt number it ran as.
--
-- operator_retry and operator_retry_many made a failed or cancelled job `pending` at once,
-- whatever its `after` dependencies: it ran while a dependency was still running, or after
-- one had failed. A retried job that has dependencies is now `waiting`, and the retry then
-- settles it as an enqueue does (resolve_waiting, read after its commit, so that a
-- dependency finishing meanwhile is seen by one side or the other:
-- jobfence.store.dependencies): pending once they all succeeded, failed — naming the
-- dependency — when one failed, was cancelled or is gone. A bulk retry settles the jobs it
-- made waiting once its whole selection is walked, so that a dependency retried in a later
-- batch than its dependent is waited for; export-finalize's safety net settles what an
-- interrupted retry left waiting. Otherwise the same rules and refusals (0019, 0021).

-- A failed or cancelled job (not a parent, nor a child of a finished parent) runs again:
-- pending now (waiting, when it has dependencies, for its caller to settle), a new attempt
-- budget, no fence, its error kept in the audit trail only. Its resource must be free (the
-- unique index decides), and a cancelled attempt of it must have stopped: until its worker
-- confirms its command is gone (or its lease has run out), a retry would run beside it.
CREATE OR REPLACE FUNCTION {schema}.operator_retry(p_job_id uuid, p_reason text)
RETURNS TABLE (job_id uuid, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    job record;
    parent_status text;
BEGIN
    IF (SELECT k.draining FROM {schema}.jobfence_control k FOR SHARE) THEN
        RAISE EXCEPTION USING ERRCODE = 'JF503',
            MESSAGE = 'drain mode is on: retry is refused until `drain off`';
    END IF;
    SELECT j.status, j.is_parent, j.parent_id, j.stopping_attempt_id, j.stopping_until
    INTO job FROM {schema}.jobs j WHERE j.job_id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JF404', DETAIL = p_job_id::text,
            MESSAGE = format('job %s not found', p_job_id);
    END IF;
    IF job.is_parent THEN
        RAISE EXCEPTION USING ERRCODE = 'JF410', MESSAGE = format(
            'job %s is a parent (retry its children): only a failed or cancelled job can '
            'be retried', p_job_id);
    END IF;
    IF job.status NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION USING ERRCODE = 'JF410', MESSAGE = format(
            'job %s is %s: only a failed or cancelled job can be retried', p_job_id,
            job.status);
    END IF;
    IF job.stopping_attempt_id IS NOT NULL AND job.stopping_until > clock_timestamp() THEN
        RAISE EXCEPTION USING ERRCODE = 'JF410', MESSAGE = format(
            'job %s is still stopping: the command of its cancelled attempt is not yet '
            'confirmed gone (at the latest when its lease ends, %s)', p_job_id,
            job.stopping_until);
    END IF;
    IF job.parent_id IS NOT NULL THEN
        SELECT p.status INTO parent_status FROM {schema}.jobs p WHERE p.job_id = job.parent_id;
        IF parent_status IS DISTINCT FROM 'running' THEN
            RAISE EXCEPTION USING ERRCODE = 'JF410', MESSAGE = format(
                'job %s is a child of %s, which is %s: a child runs only while its parent '
                'does', p_job_id, job.parent_id, coalesce(parent_status, 'gone'));
        END IF;
    END IF;
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        status = CASE WHEN EXISTS (SELECT FROM {schema}.job_dependencies d
                                   WHERE d.job_id = j.job_id)
                      THEN 'waiting' ELSE 'pending' END,
        attempt_count = 0, interruptions = 0, attempt_id = NULL,
        claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, run_deadline_at = NULL,
        stopping_attempt_id = NULL, stopping_until = NULL,
        visible_at = now(), expires_at = NULL, finished_at = NULL, retain_until = NULL,
        error = NULL, error_detail = NULL, reason = p_reason
    WHERE j.job_id = p_job_id
    RETURNING j.job_id, j.status;
END;
$$;

-- operator_retry for each of at most 1,000 jobs: the same rules, a refusal per job instead
-- of an exception (not_found, not_failed_or_cancelled, parent, stopping,
-- parent_not_running, resource_busy). Rows are locked in id order. A job holding a
-- resource is retried on its own (a subtransaction) so that a busy resource refuses that
-- job alone; the others go in one statement.
CREATE OR REPLACE FUNCTION {schema}.operator_retry_many(p_job_ids uuid[], p_reason text)
RETURNS TABLE (job_id uuid, status text, refusal text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    ids uuid[] := ARRAY(SELECT DISTINCT u FROM unnest(p_job_ids[1:1000]) u WHERE u IS NOT NULL);
    plain uuid[] := '{{}}';
    held uuid[] := '{{}}';
    one uuid;
    v record;
BEGIN
    IF (SELECT k.draining FROM {schema}.jobfence_control k FOR SHARE) THEN
        RAISE EXCEPTION USING ERRCODE = 'JF503',
            MESSAGE = 'drain mode is on: retry is refused until `drain off`';
    END IF;
    FOR v IN
        WITH locked AS (
            SELECT j.job_id, j.status, j.is_parent, j.parent_id, j.resource,
                   j.stopping_attempt_id, j.stopping_until
            FROM {schema}.jobs j WHERE j.job_id = ANY(ids) ORDER BY j.job_id FOR UPDATE
        )
        SELECT i.id, l.status, l.resource, CASE
            WHEN l.job_id IS NULL THEN 'not_found'
            WHEN l.is_parent THEN 'parent'
            WHEN l.status NOT IN ('failed', 'cancelled') THEN 'not_failed_or_cancelled'
            WHEN l.stopping_attempt_id IS NOT NULL AND l.stopping_until > clock_timestamp()
                THEN 'stopping'
            WHEN l.parent_id IS NOT NULL AND (SELECT p.status FROM {schema}.jobs p
                                              WHERE p.job_id = l.parent_id)
                                             IS DISTINCT FROM 'running'
                THEN 'parent_not_running'
        END AS refusal
        FROM unnest(ids) AS i (id) LEFT JOIN locked l ON l.job_id = i.id
    LOOP
        IF v.refusal IS NOT NULL THEN
            job_id := v.id; status := v.status; refusal := v.refusal;
            RETURN NEXT;
        ELSIF v.resource IS NULL THEN
            plain := plain || v.id;
        ELSE
            held := held || v.id;
        END IF;
    END LOOP;
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        status = CASE WHEN EXISTS (SELECT FROM {schema}.job_dependencies d
                                   WHERE d.job_id = j.job_id)
                      THEN 'waiting' ELSE 'pending' END,
        attempt_count = 0, interruptions = 0, attempt_id = NULL,
        claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, run_deadline_at = NULL,
        stopping_attempt_id = NULL, stopping_until = NULL,
        visible_at = now(), expires_at = NULL, finished_at = NULL, retain_until = NULL,
        error = NULL, error_detail = NULL, reason = p_reason
    WHERE j.job_id = ANY(plain)
    RETURNING j.job_id, j.status, NULL::text;
    FOREACH one IN ARRAY held LOOP
        BEGIN
            RETURN QUERY
            UPDATE {schema}.jobs j SET
                status = CASE WHEN EXISTS (SELECT FROM {schema}.job_dependencies d
                                           WHERE d.job_id = j.job_id)
                              THEN 'waiting' ELSE 'pending' END,
                attempt_count = 0, interruptions = 0, attempt_id = NULL,
                claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL,
                run_deadline_at = NULL, stopping_attempt_id = NULL, stopping_until = NULL,
                visible_at = now(), expires_at = NULL, finished_at = NULL,
                retain_until = NULL, error = NULL, error_detail = NULL, reason = p_reason
            WHERE j.job_id = one
            RETURNING j.job_id, j.status, NULL::text;
        EXCEPTION WHEN unique_violation THEN
            job_id := one; status := NULL; refusal := 'resource_busy';
            RETURN NEXT;
        END;
    END LOOP;
END;
$$;

-- A snoozed claim's output ------------------------------------------------------------
-- The action that asks to run again later ends its claim like a failure ends one, yet what
-- it said — a command's exit code and output tails, or that its whole output went to S3 —
-- was stored nowhere: `status` showed nothing of that claim and `logs` could not find its
-- output. worker_snooze now takes the snoozing action's outcome too and records it under
-- the fence, as `snoozed` (neither done nor failed: the next claim runs that action again).
-- The one-row snooze of 0028 stays for a worker of the release before.

ALTER TABLE {schema}.job_action_results DROP CONSTRAINT job_action_results_status_check;
ALTER TABLE {schema}.job_action_results ADD CONSTRAINT job_action_results_status_check
    CHECK (status IN ('succeeded', 'failed', 'snoozed'));

CREATE FUNCTION {schema}.worker_snooze(p_job_id uuid, p_attempt_id uuid,
    p_delay_seconds float8, p_reason text, p_max_snoozes integer,
    p_action_index integer, p_action_name text, p_action_status text,
    p_action_started_at timestamptz, p_action_result jsonb, p_action_error text,
    p_action_error_detail text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF p_action_index IS NOT NULL AND p_action_status IS DISTINCT FROM 'snoozed' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'a snoozing action''s outcome is recorded as snoozed';
    END IF;
    -- Under the fence (the same rows worker_snooze then matches, locked first).
    INSERT INTO {schema}.job_action_results AS r (
        job_id, attempt_id, action_index, name, status, started_at, result, error,
        error_detail)
    SELECT j.job_id, j.attempt_id, p_action_index, p_action_name, 'snoozed',
        p_action_started_at, p_action_result, p_action_error, p_action_error_detail
    FROM {schema}.jobs j
    WHERE p_action_index IS NOT NULL AND j.job_id = p_job_id
      AND j.attempt_id = p_attempt_id AND j.status = 'running'
      AND j.visible_at > clock_timestamp()
    ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
        status = excluded.status, result = excluded.result, error = excluded.error,
        error_detail = excluded.error_detail, finished_at = excluded.finished_at;
    RETURN QUERY
    SELECT * FROM {schema}.worker_snooze(p_job_id, p_attempt_id, p_delay_seconds, p_reason,
                                         p_max_snoozes);
END;
$$;

-- Each claim's attempt number, in its audit event ------------------------------------
-- `status` shows `attempt N/M` (the attempt count) and the worker's output lines carry that
-- N, but `logs` numbered a job's claims one by one from its audit trail: a claim given back
-- by a snooze or a SIGTERM spends no attempt and the next claim runs as the same attempt,
-- and a retry starts counting afresh, so `logs --attempt 2` could be what `status` called
-- attempt 1. The claim's event now keeps the attempt count it ran as (job_events.attempt,
-- filled in by a trigger from the job's row, whoever wrote the event), and every surface
-- numbers a claim by it. Events written before this migration have none (NULL).

ALTER TABLE {schema}.job_events ADD COLUMN attempt integer;

CREATE FUNCTION {schema}.jobfence_event_attempt() RETURNS trigger
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
BEGIN
    NEW.attempt := (SELECT j.attempt_count FROM {schema}.jobs j WHERE j.job_id = NEW.job_id);
    RETURN NEW;
END;
$$;

CREATE TRIGGER job_events_attempt
    BEFORE INSERT ON {schema}.job_events
    FOR EACH ROW
    WHEN (NEW.to_status = 'running' AND NEW.from_status IS DISTINCT FROM 'running')
    EXECUTE FUNCTION {schema}.jobfence_event_attempt();
