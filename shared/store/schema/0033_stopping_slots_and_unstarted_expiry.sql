-- 0033: two rules that held for one verb and not for another.
--
-- * A queue's limit on running jobs counts an attempt still stopping. A cancel, a run
--   timeout or a reclaim of a pod whose node stopped answering rotates the fence while the
--   attempt's command may still run; the attempt kept its job's resource (0019) but gave up
--   its queue slot, so a second job of a limit-1 queue could run beside a command still
--   running — for up to a lease when its worker was frozen. worker_claim now counts it,
--   until its worker confirms the command gone (worker_stopped) or its lease runs out (a
--   worker that cannot renew its lease has killed its command by then: invariant 6).
-- * `expires_in` ("cancelled if not started by then") expires only jobs that never
--   started. lifecycle's expire_pending (maintenance.sql) cancelled any waiting or pending
--   job past its expires_at — a job snoozed, waiting for its retry, given back on SIGTERM
--   or reclaimed too, its attempts unused. It now passes over any job with a started_at;
--   the index it walks holds only jobs never started, so a started job past its expiry is
--   never read again by the pass.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

DROP INDEX {schema}.jobs_pending_expiry;
CREATE INDEX jobs_pending_expiry ON {schema}.jobs (expires_at)
    WHERE status IN ('waiting', 'pending') AND expires_at IS NOT NULL AND started_at IS NULL;
