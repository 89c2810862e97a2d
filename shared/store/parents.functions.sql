-- Database functions of a parent and its children: the summary, the children's pages and
-- errors, the one finalization (store/parents.py runs them through parents.sql).
--
-- {{schema}} is the installation's schema, filled in as a quoted identifier (braces of the
-- file's own doubled). `jobfence migrate` re-creates this whole file, in one transaction with
-- the other changed files and as the owner role, after the migrations and before the roles'
-- grants, whenever its text changed (store/migrations.py): edit a function here, never in a
-- migration. Every statement must be safe to run again: CREATE OR REPLACE, and DROP ... IF
-- EXISTS first where a signature, a return type or an argument's name changes (see
-- docs/DEVELOPERS.md). Each function's history before 0038 is in store/schema/.

-- A parent, whether a child of it is still active, and its children's counts by status
-- (read only once no child is active), in one read.
CREATE OR REPLACE FUNCTION {schema}.jobfence_parent_summary(p_parent_id uuid)
RETURNS TABLE (job_id uuid, status text, inputs jsonb, active boolean, counts jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT p.job_id, p.status, p.inputs, a.active,
           CASE WHEN NOT a.active THEN
               (SELECT coalesce(jsonb_object_agg(s.status, s.n), '{{}}'::jsonb)
                FROM (SELECT c.status, count(*) AS n FROM {schema}.jobs c
                      WHERE c.parent_id = p.job_id GROUP BY c.status) s)
           END
    FROM {schema}.jobs p
    CROSS JOIN LATERAL (SELECT EXISTS (
        SELECT FROM {schema}.jobs c WHERE c.parent_id = p.job_id
          AND c.status IN ('waiting', 'pending', 'running')) AS active) a
    WHERE p.job_id = p_parent_id AND p.is_parent;
$$;

-- The parent of the child this attempt made terminal, while that parent is running and
-- none of its children is active any more; NULL for anything else. So what the worker's
-- functions list of the children are terminal jobs only, whose kept attempt ids no write
-- accepts (every worker write needs a running job).
CREATE OR REPLACE FUNCTION {schema}.jobfence_parent_of_attempt(
    p_child_id uuid, p_attempt_id uuid)
RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT p.job_id FROM {schema}.jobs c JOIN {schema}.jobs p ON p.job_id = c.parent_id
    WHERE c.job_id = p_child_id AND p_attempt_id IS NOT NULL
      AND c.attempt_id = p_attempt_id AND c.status IN ('succeeded', 'failed')
      AND p.status = 'running'
      AND NOT EXISTS (SELECT FROM {schema}.jobs s WHERE s.parent_id = p.job_id
                      AND s.status IN ('waiting', 'pending', 'running'));
$$;

-- A parent's children with their committed outputs (jobfence_committed_outputs) for a
-- child that succeeded.
CREATE OR REPLACE FUNCTION {schema}.jobfence_children_page(p_parent_id uuid, p_after uuid,
                                                           p_limit integer)
RETURNS TABLE (job_id uuid, status text, attempt_id uuid, inputs jsonb, error text,
               outputs text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT c.job_id, c.status, c.attempt_id, c.inputs, c.error,
        ARRAY(SELECT o.url
              FROM {schema}.jobfence_committed_outputs(c.job_id, c.attempt_id, c.run) o
              WHERE c.status = 'succeeded'
              ORDER BY o.path, o.created_at)
    FROM {schema}.jobs c
    WHERE c.parent_id = p_parent_id AND c.job_id > p_after
    ORDER BY c.job_id
    LIMIT least(greatest(p_limit, 0), 10000);
$$;

-- A parent's first failed or cancelled children (at most 100), for its error summary.
CREATE OR REPLACE FUNCTION {schema}.jobfence_first_errors(p_parent_id uuid, p_limit integer)
RETURNS TABLE (job_id uuid, status text, error text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT c.job_id, c.status, c.error FROM {schema}.jobs c
    WHERE c.parent_id = p_parent_id AND c.status IN ('failed', 'cancelled')
    ORDER BY c.job_id
    LIMIT least(greatest(p_limit, 0), 100);
$$;

-- The one finalization of a parent: only while it is running and every child is terminal,
-- so however many finishers race (workers, lifecycle, export-finalize), one UPDATE matches.
CREATE OR REPLACE FUNCTION {schema}.jobfence_finalize_parent(
    p_parent_id uuid, p_status text, p_manifest text, p_reason text, p_error text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    UPDATE {schema}.jobs p SET
        status = p_status,
        manifest = p_manifest,
        finished_at = now(),
        retain_until = now() + p.ttl,
        reason = p_reason,
        error = p_error
    WHERE p.job_id = p_parent_id AND p.is_parent AND p.status = 'running'
      AND p_status IN ('succeeded', 'failed')
      AND NOT EXISTS (SELECT FROM {schema}.jobs c WHERE c.parent_id = p.job_id
                      AND c.status IN ('waiting', 'pending', 'running'))
    RETURNING p.job_id, p.status, p.parent_id;
$$;

-- The summary of the parent this attempt finalizes, NULL when it finalizes none.
CREATE OR REPLACE FUNCTION {schema}.worker_parent_summary(
    p_child_id uuid, p_attempt_id uuid)
RETURNS TABLE (job_id uuid, status text, inputs jsonb, active boolean, counts jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.jobfence_parent_summary(
        {schema}.jobfence_parent_of_attempt(p_child_id, p_attempt_id));
$$;

-- A page of the children of the parent this attempt finalizes (jobfence_children_page).
CREATE OR REPLACE FUNCTION {schema}.worker_parent_children(
    p_child_id uuid, p_attempt_id uuid, p_after uuid, p_limit integer)
RETURNS TABLE (job_id uuid, status text, attempt_id uuid, inputs jsonb, error text,
               outputs text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.jobfence_children_page(
        {schema}.jobfence_parent_of_attempt(p_child_id, p_attempt_id), p_after, p_limit);
$$;

-- The first errors of the children of the parent this attempt finalizes.
CREATE OR REPLACE FUNCTION {schema}.worker_parent_errors(p_child_id uuid, p_attempt_id uuid,
                                                         p_limit integer)
RETURNS TABLE (job_id uuid, status text, error text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.jobfence_first_errors(
        {schema}.jobfence_parent_of_attempt(p_child_id, p_attempt_id), p_limit);
$$;

-- Finalize the parent of the child this attempt made terminal, once that child was the
-- last active one (jobfence_finalize_parent).
CREATE OR REPLACE FUNCTION {schema}.worker_finalize_parent(
    p_child_id uuid, p_attempt_id uuid, p_status text, p_manifest text, p_reason text,
    p_error text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.jobfence_finalize_parent(
        {schema}.jobfence_parent_of_attempt(p_child_id, p_attempt_id), p_status,
        left(p_manifest, 2000), left(p_reason, 2000), left(p_error, 8000));
$$;

-- Open a finished parent again (a workflow's retry of its fan-out step): the parent running
-- (waiting, with its children, while it has dependencies: they settle it as an enqueue's),
-- and each of its failed or cancelled children run again with new attempts, as
-- operator_retry runs a job; its succeeded children kept. The parent's next finalization
-- writes its manifest again. Nothing unless the parent failed or was cancelled, and not
-- while drain mode is on (JF503). The jobs moved back (the parent first).
CREATE OR REPLACE FUNCTION {schema}.operator_reopen_parent(p_parent_id uuid, p_reason text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
#variable_conflict use_column
DECLARE
    waits boolean := EXISTS (SELECT FROM {schema}.job_dependencies d
                             WHERE d.job_id = p_parent_id);
BEGIN
    IF (SELECT k.draining FROM {schema}.jobfence_control k FOR SHARE) THEN
        RAISE EXCEPTION USING ERRCODE = 'JF503',
            MESSAGE = 'drain mode is on: retry is refused until `drain off`';
    END IF;
    RETURN QUERY
    UPDATE {schema}.jobs p SET
        status = CASE WHEN waits THEN 'waiting' ELSE 'running' END,
        started_at = CASE WHEN waits THEN NULL ELSE now() END,
        finished_at = NULL, retain_until = NULL, manifest = NULL, expires_at = NULL,
        error = NULL, error_detail = NULL, reason = p_reason
    WHERE p.job_id = p_parent_id AND p.is_parent AND p.status IN ('failed', 'cancelled')
    RETURNING p.job_id, p.status, p.parent_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE {schema}.jobs c SET
        status = CASE WHEN waits THEN 'waiting' ELSE 'pending' END,
        attempt_count = 0, interruptions = 0, attempt_id = NULL,
        claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, run_deadline_at = NULL,
        visible_at = now(), expires_at = NULL, finished_at = NULL, retain_until = NULL,
        error = NULL, error_detail = NULL, reason = p_reason
    WHERE c.parent_id = p_parent_id AND c.status IN ('failed', 'cancelled')
      AND (c.stopping_attempt_id IS NULL OR c.stopping_until <= clock_timestamp())
    RETURNING c.job_id, c.status, c.parent_id;
END;
$$;
