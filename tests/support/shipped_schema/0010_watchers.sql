-- 0010: `jobfence wait` is told when a job ends instead of polling for it.
--
-- A waiter registers the job it waits on (job_watchers) and LISTENs on the installation's
-- channel "<schema>.finished"; the audit trigger notifies that channel when a watched job
-- becomes terminal. Only watched jobs are notified: NOTIFY serializes the commits of the
-- transactions that send one, and most terminal writes have nobody waiting. A watcher
-- goes with its job (cascade) and is removed by its waiter when it stops waiting; the
-- waiter polls as a fallback, so a notification lost to a race (a watcher registered while
-- the job's terminal write was under way) or to a pooler costs one polling interval.
CREATE TABLE job_watchers (
    job_id uuid PRIMARY KEY REFERENCES jobs (job_id) ON DELETE CASCADE,
    since  timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION jobfence_audit_update() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT SET enable_nestloop = off AS $$
BEGIN
    INSERT INTO job_events (job_id, from_status, to_status, attempt_id, reason)
    SELECT n.job_id, o.status, n.status, coalesce(o.attempt_id, n.attempt_id), n.reason
    FROM old_rows o JOIN new_rows n USING (job_id)
    WHERE o.status IS DISTINCT FROM n.status OR o.attempt_id IS DISTINCT FROM n.attempt_id;
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.finished', n.job_id::text)
    FROM new_rows n JOIN job_watchers w ON w.job_id = n.job_id
    WHERE n.status IN ('succeeded', 'failed', 'cancelled');
    RETURN NULL;
END
$$;
