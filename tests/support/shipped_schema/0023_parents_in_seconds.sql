-- 0023: a datum parent is finalized by the worker whose terminal write ended its last
-- child, seconds after it, as the job's last datum finishes it; export-finalize stays the
-- safety net (a worker that dies between the two writes, a child ended by the sweeper's,
-- reconciliation's or an operator's verb).
--
-- The worker role reads nothing of other jobs directly. These functions answer the attempt
-- that made a child terminal — the child's kept fence (attempt_id) is that attempt — about
-- that child's parent only, and only once every child of it is terminal: its summary, its
-- children as the manifest lists them, its first errors, and its one finalization. Any
-- other attempt, a sibling still active, a job without a parent: no row.
--
-- summary (parents.sql, and worker_parent_summary here) replaces three reads — the parent,
-- whether a child is still active, the children's counts — with one; the counts are read
-- only once no child is active.

CREATE FUNCTION {schema}.jobfence_parent_summary(p_parent_id uuid)
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
CREATE FUNCTION {schema}.jobfence_parent_of_attempt(p_child_id uuid, p_attempt_id uuid)
RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT p.job_id FROM {schema}.jobs c JOIN {schema}.jobs p ON p.job_id = c.parent_id
    WHERE c.job_id = p_child_id AND p_attempt_id IS NOT NULL
      AND c.attempt_id = p_attempt_id AND c.status IN ('succeeded', 'failed')
      AND p.status = 'running'
      AND NOT EXISTS (SELECT FROM {schema}.jobs s WHERE s.parent_id = p.job_id
                      AND s.status IN ('waiting', 'pending', 'running'));
$$;

CREATE FUNCTION {schema}.worker_parent_summary(p_child_id uuid, p_attempt_id uuid)
RETURNS TABLE (job_id uuid, status text, inputs jsonb, active boolean, counts jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.jobfence_parent_summary(
        {schema}.jobfence_parent_of_attempt(p_child_id, p_attempt_id));
$$;

CREATE FUNCTION {schema}.jobfence_children_page(p_parent_id uuid, p_after uuid,
                                                p_limit integer)
RETURNS TABLE (job_id uuid, status text, attempt_id uuid, inputs jsonb, error text,
               outputs text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT c.job_id, c.status, c.attempt_id, c.inputs, c.error,
        ARRAY(SELECT o.url FROM {schema}.job_outputs o
              WHERE c.status = 'succeeded' AND o.job_id = c.job_id
                AND o.attempt_id = c.attempt_id AND o.status = 'done'
              ORDER BY o.path)
    FROM {schema}.jobs c
    WHERE c.parent_id = p_parent_id AND c.job_id > p_after
    ORDER BY c.job_id
    LIMIT least(greatest(p_limit, 0), 10000);
$$;

CREATE FUNCTION {schema}.worker_parent_children(p_child_id uuid, p_attempt_id uuid,
                                                p_after uuid, p_limit integer)
RETURNS TABLE (job_id uuid, status text, attempt_id uuid, inputs jsonb, error text,
               outputs text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.jobfence_children_page(
        {schema}.jobfence_parent_of_attempt(p_child_id, p_attempt_id), p_after, p_limit);
$$;

CREATE FUNCTION {schema}.jobfence_first_errors(p_parent_id uuid, p_limit integer)
RETURNS TABLE (job_id uuid, status text, error text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT c.job_id, c.status, c.error FROM {schema}.jobs c
    WHERE c.parent_id = p_parent_id AND c.status IN ('failed', 'cancelled')
    ORDER BY c.job_id
    LIMIT least(greatest(p_limit, 0), 100);
$$;

CREATE FUNCTION {schema}.worker_parent_errors(p_child_id uuid, p_attempt_id uuid,
                                              p_limit integer)
RETURNS TABLE (job_id uuid, status text, error text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.jobfence_first_errors(
        {schema}.jobfence_parent_of_attempt(p_child_id, p_attempt_id), p_limit);
$$;

-- The one finalization of a parent: only while it is running and every child is terminal,
-- so however many finishers race (workers, lifecycle, export-finalize), one UPDATE matches.
CREATE FUNCTION {schema}.jobfence_finalize_parent(p_parent_id uuid, p_status text,
                                                  p_manifest text, p_reason text,
                                                  p_error text)
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

CREATE FUNCTION {schema}.worker_finalize_parent(p_child_id uuid, p_attempt_id uuid,
                                                p_status text, p_manifest text,
                                                p_reason text, p_error text)
RETURNS TABLE (job_id uuid, status text, parent_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    SELECT * FROM {schema}.jobfence_finalize_parent(
        {schema}.jobfence_parent_of_attempt(p_child_id, p_attempt_id), p_status,
        left(p_manifest, 2000), left(p_reason, 2000), left(p_error, 8000));
$$;
