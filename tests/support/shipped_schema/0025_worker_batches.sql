-- 0025: a worker that runs many jobs at once writes for them in batches, never at the cost
-- of a fence.
--
-- One statement renews every lease a worker holds (worker_heartbeat_many), one gives back
-- every job it holds when it gets SIGTERM (worker_interrupt_many), and one writes the
-- terminal state of every job that finished meanwhile (worker_finish_many). Each row is
-- matched on its own (job_id, attempt_id) and a live lease exactly as the one-row verbs
-- match theirs, and each verb returns the rows that matched: a row whose fence was rotated
-- matches nothing and is left out, and only its job stops — the others' rows are written.
-- The audit trail and the metric deltas come from the statement-level triggers: one trigger
-- run per batch, one event per job. The claim that rides on a batch is worker_claim, in the
-- same transaction: one fresh attempt_id per claimed row, the queue's limit counted per job.
--
-- Additive: the one-row verbs stay (a worker of the release before runs beside this one).

-- The bound every batch verb checks: as many rows as a claim may take.
CREATE FUNCTION {schema}.jobfence_check_batch(p_name text, p_rows integer)
RETURNS void LANGUAGE plpgsql IMMUTABLE SET search_path = {schema}, pg_temp AS $$
BEGIN
    IF p_rows IS NULL OR p_rows > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('%s: at most 1000 rows in one batch, not %s', p_name,
                             coalesce(p_rows::text, 'null'));
    END IF;
END
$$;

-- Renew the leases of these attempts, each matched on its own fence; the ones renewed.
CREATE FUNCTION {schema}.worker_heartbeat_many(p_job_ids uuid[], p_attempt_ids uuid[],
                                               p_lease_seconds float8)
RETURNS TABLE (job_id uuid, lease_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.jobfence_check_bounds('lease_seconds', p_lease_seconds, 0.001, 86400);
    PERFORM {schema}.jobfence_check_batch('heartbeat', cardinality(p_job_ids));
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        visible_at = now() + make_interval(secs => p_lease_seconds),
        heartbeat_at = now()
    FROM unnest(p_job_ids, p_attempt_ids) AS a (job_id, attempt_id)
    WHERE j.job_id = a.job_id AND j.attempt_id = a.attempt_id
      AND j.status = 'running' AND j.visible_at > clock_timestamp()
    RETURNING j.job_id, j.visible_at;
END;
$$;

-- The terminal writes (succeeded or failed) of attempts that finished, each with its last
-- action's outcome when it has one, each matched on its own fence and a live lease; the
-- jobs written. A row given twice counts once.
CREATE FUNCTION {schema}.worker_finish_many(p_rows jsonb)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF jsonb_typeof(p_rows) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'the terminal writes must be a JSON array';
    END IF;
    PERFORM {schema}.jobfence_check_batch('finish', jsonb_array_length(p_rows));
    RETURN QUERY
    WITH given AS (
        SELECT DISTINCT ON (x.job_id) x.*
        FROM jsonb_to_recordset(p_rows) AS x (
            job_id uuid, attempt_id uuid, status text, reason text, error text,
            error_detail text, action_index integer, action_name text, action_status text,
            action_started_at timestamptz, action_result jsonb, action_error text,
            action_error_detail text)
        WHERE x.job_id IS NOT NULL AND x.attempt_id IS NOT NULL
          AND x.status IN ('succeeded', 'failed')
        ORDER BY x.job_id
    ), written AS (
        UPDATE {schema}.jobs j SET
            status = g.status,
            finished_at = now(),
            retain_until = now() + j.ttl,
            run_deadline_at = NULL,
            reason = coalesce(g.reason, g.status),
            error = g.error,
            error_detail = g.error_detail
        FROM given g
        WHERE j.job_id = g.job_id AND j.attempt_id = g.attempt_id
          AND j.status = 'running' AND j.visible_at > clock_timestamp()
        RETURNING j.job_id, j.status, j.parent_id
    ), recorded AS (
        INSERT INTO {schema}.job_action_results (
            job_id, attempt_id, action_index, name, status, started_at, result, error,
            error_detail
        )
        SELECT g.job_id, g.attempt_id, g.action_index, g.action_name, g.action_status,
            g.action_started_at, g.action_result, g.action_error, g.action_error_detail
        FROM written w JOIN given g ON g.job_id = w.job_id
        WHERE g.action_index IS NOT NULL
        ON CONFLICT (job_id, attempt_id, action_index) DO UPDATE SET
            status = excluded.status, result = excluded.result, error = excluded.error,
            error_detail = excluded.error_detail, finished_at = excluded.finished_at
    )
    SELECT w.job_id, w.status, w.parent_id FROM written w;
END;
$$;

-- SIGTERM with many jobs in hand: give every one back at once, each matched on its own
-- fence, exactly as worker_interrupt gives back one.
CREATE FUNCTION {schema}.worker_interrupt_many(p_job_ids uuid[], p_attempt_ids uuid[],
                                               p_reason text, p_max_interruptions integer)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.jobfence_check_bounds('max_interruptions', p_max_interruptions, 0,
                                          1000000);
    PERFORM {schema}.jobfence_check_batch('interrupt', cardinality(p_job_ids));
    RETURN QUERY
    UPDATE {schema}.jobs j SET
        status = CASE WHEN j.interruptions < p_max_interruptions
                        OR j.attempt_count < j.max_attempts THEN 'pending' ELSE 'failed' END,
        attempt_count = CASE WHEN j.interruptions < p_max_interruptions
                             THEN j.attempt_count - 1 ELSE j.attempt_count END,
        interruptions = j.interruptions + 1,
        attempt_id = CASE WHEN j.interruptions < p_max_interruptions
                            OR j.attempt_count < j.max_attempts THEN NULL
                          ELSE j.attempt_id END,
        visible_at = now(),
        finished_at = CASE WHEN j.interruptions >= p_max_interruptions
                            AND j.attempt_count >= j.max_attempts THEN now() END,
        retain_until = CASE WHEN j.interruptions >= p_max_interruptions
                             AND j.attempt_count >= j.max_attempts THEN now() + j.ttl END,
        claimed_by = NULL,
        run_deadline_at = NULL,
        reason = p_reason,
        error = p_reason
    FROM unnest(p_job_ids, p_attempt_ids) AS a (job_id, attempt_id)
    WHERE j.job_id = a.job_id AND j.attempt_id = a.attempt_id
      AND j.status = 'running' AND j.visible_at > clock_timestamp()
    RETURNING j.job_id, j.status, j.parent_id;
END;
$$;
