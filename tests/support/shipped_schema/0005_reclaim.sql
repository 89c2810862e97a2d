-- 0005: one rule for taking a live claim away.
--
-- The sweeper (lease expired), reconciliation (worker pod gone or dead) and lifecycle (run
-- timed out) all take claims away from workers that may still be alive. They share this
-- function so that they cannot drift apart: the fence is rotated (attempt_id and claimer
-- cleared, so every write of the old attempt matches nothing), and the job goes back to
-- pending after the retry delay, or fails once its attempts are exhausted (the attempt was
-- counted at its claim). ``error`` records the cause either way, as a failed action does.
-- Only rows still running are touched; the callers pick them FOR UPDATE SKIP LOCKED.
CREATE FUNCTION jobfence_reclaim(ids uuid[], reasons text[], errors text[],
                                 base_seconds float8, cap_seconds float8)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql VOLATILE AS $$
    UPDATE jobs j SET
        status = CASE WHEN j.attempt_count >= j.max_attempts THEN 'failed' ELSE 'pending' END,
        attempt_id = NULL,
        claimed_by = NULL,
        run_deadline_at = NULL,
        visible_at = now() + jobfence_retry_delay(j.attempt_count, base_seconds, cap_seconds),
        finished_at = CASE WHEN j.attempt_count >= j.max_attempts THEN now() END,
        retain_until = CASE WHEN j.attempt_count >= j.max_attempts THEN now() + j.ttl END,
        reason = r.reason,
        error = r.error
    FROM unnest(ids, reasons, errors) AS r (job_id, reason, error)
    WHERE j.job_id = r.job_id AND j.status = 'running' AND NOT j.is_parent
    RETURNING j.job_id, j.status, j.parent_id
$$;
