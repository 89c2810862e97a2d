-- 0010: `jobfence wait` is told when a job ends instead of polling for it.
--
-- A waiter registers the job it waits on (job_watchers) and LISTENs on the installation's
-- channel "<schema>.finished"; the audit trigger notifies that channel when a watched job
-- becomes terminal. Only watched jobs are notified: NOTIFY serializes the commits of the
-- transactions that send one, and most terminal writes have nobody waiting. A watcher
-- goes with its job (cascade) and is removed by its waiter when it stops waiting; the
-- waiter polls as a fallback, so a notification lost to a race (a watcher registered while
-- the job's terminal write was under way) or to a pooler costs one polling interval.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.
CREATE TABLE job_watchers (
    job_id uuid PRIMARY KEY REFERENCES jobs (job_id) ON DELETE CASCADE,
    since  timestamptz NOT NULL DEFAULT now()
);
