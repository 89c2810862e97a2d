-- Datum parents: finding the ones whose children are done, finalizing each once.
-- Named statements, run by the method of the same name in store/parents.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- ready --
-- Running parents, after %(after)s in id order, whose children are all terminal.
SELECT p.job_id FROM {schema}.jobs p
WHERE p.is_parent AND p.status = 'running' AND p.job_id > %(after)s
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs c WHERE c.parent_id = p.job_id
                  AND c.status IN ('waiting', 'pending', 'running'))
ORDER BY p.job_id
LIMIT %(limit)s;

-- has_active_children --
-- Whether a parent still has a child that is not terminal (one index probe).
SELECT EXISTS (SELECT 1 FROM {schema}.jobs WHERE parent_id = %(parent_id)s
               AND status IN ('waiting', 'pending', 'running')) AS active;

-- children_page --
-- One page of a parent's children with their committed outputs: the winning attempt's
-- confirmed files, and only for a child that succeeded.
SELECT c.job_id, c.status, c.attempt_id, c.inputs, c.error,
    ARRAY(SELECT o.url FROM {schema}.job_outputs o
          WHERE c.status = 'succeeded' AND o.job_id = c.job_id
            AND o.attempt_id = c.attempt_id AND o.status = 'done'
          ORDER BY o.path) AS outputs
FROM {schema}.jobs c
WHERE c.parent_id = %(parent_id)s AND c.job_id > %(after)s
ORDER BY c.job_id
LIMIT %(limit)s;

-- first_errors --
-- The first few children that did not succeed, for the parent's error message.
SELECT job_id, status, error FROM {schema}.jobs
WHERE parent_id = %(parent_id)s AND status IN ('failed', 'cancelled')
ORDER BY job_id
LIMIT %(limit)s;

-- finalize --
-- The one finalization of a parent: only while it is running and every child is terminal,
-- so however many finishers race, one UPDATE matches.
UPDATE {schema}.jobs p SET
    status = %(status)s,
    manifest = %(manifest)s,
    finished_at = now(),
    retain_until = now() + p.ttl,
    reason = %(reason)s,
    error = %(error)s
WHERE p.job_id = %(job_id)s AND p.is_parent AND p.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs c WHERE c.parent_id = p.job_id
                  AND c.status IN ('waiting', 'pending', 'running'))
RETURNING p.job_id, p.status, p.parent_id;
