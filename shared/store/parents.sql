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

-- summary --
-- A parent: its status and inputs, whether a child is still active, and (once none is) its
-- children's counts by status, in one read (parents.functions.sql).
SELECT * FROM {schema}.jobfence_parent_summary(%(parent_id)s::uuid);

-- children_page --
-- One page of a parent's children with their committed outputs: the winning attempt's
-- confirmed files, and only for a child that succeeded.
SELECT * FROM {schema}.jobfence_children_page(%(parent_id)s::uuid, %(after)s::uuid,
                                              %(limit)s::integer);

-- first_errors --
-- The first few children that did not succeed, for the parent's error message.
SELECT * FROM {schema}.jobfence_first_errors(%(parent_id)s::uuid, %(limit)s::integer);

-- finalize --
-- The one finalization of a parent: only while it is running and every child is terminal,
-- so however many finishers race, one UPDATE matches.
SELECT * FROM {schema}.jobfence_finalize_parent(%(parent_id)s::uuid, %(status)s::text,
    %(manifest)s::text, %(reason)s::text, %(error)s::text);

-- The same four, for the worker whose attempt made one of the parent's children terminal:
-- the child and that attempt name the parent (nothing for any other attempt).

-- attempt_summary --
SELECT * FROM {schema}.worker_parent_summary(%(child_id)s::uuid, %(attempt_id)s::uuid);

-- attempt_children_page --
SELECT * FROM {schema}.worker_parent_children(%(child_id)s::uuid, %(attempt_id)s::uuid,
                                              %(after)s::uuid, %(limit)s::integer);

-- attempt_first_errors --
SELECT * FROM {schema}.worker_parent_errors(%(child_id)s::uuid, %(attempt_id)s::uuid,
                                            %(limit)s::integer);

-- attempt_finalize --
SELECT * FROM {schema}.worker_finalize_parent(%(child_id)s::uuid, %(attempt_id)s::uuid,
    %(status)s::text, %(manifest)s::text, %(reason)s::text, %(error)s::text);

-- reopen --
-- Open a failed or cancelled parent again with its failed and cancelled children (a
-- workflow's retry of a fan-out step): operator_reopen_parent.
SELECT * FROM {schema}.operator_reopen_parent(%(parent_id)s::uuid, %(reason)s::text);
