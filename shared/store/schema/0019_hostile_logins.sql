-- 0019: boundaries that hold against a hostile login (invariant 13), and no overlap after a
-- cancel (invariant 12).
--
-- From this migration on, a migration names every object with its schema ({schema}, filled
-- in as a quoted identifier, as in the named statements) and every function pins its
-- search path to `{schema}, pg_temp`: PostgreSQL searches pg_temp FIRST for relations
-- unless it is listed, so a function whose path lacks it resolves a name in the caller's
-- temporary schema before its own. The audit trigger function of 0015 was such a function:
-- a login that created a temporary `job_events` redirected its own transitions' audit
-- trail there. Every function of the schema is re-created here with qualified names.
--
-- * Roles hold their verbs only. The operator role no longer updates jobs, queues, the
--   drain switch or the manual triggers directly: it runs the functions below, each doing
--   what one operator command does, each audited (job_events for jobs, control_events for
--   queues, drain and triggers). A job it inserts is born the way an enqueue makes one
--   (jobs_born_fresh). The worker's functions answer only about the attempt they are
--   given, a NULL attempt never holds, and every number they take is bounded here too.
-- * Stopping. A cancel (or a run timeout enforced by lifecycle) of a running job rotates
--   the fence while the attempt's command may still run. The attempt is kept as
--   `stopping_attempt_id` until its worker confirms its command is gone (worker_stopped)
--   or its lease has run out (`stopping_until`, cleared by the sweeper): meanwhile the job
--   keeps its resource (jobs_resource_active counts it), is not claimed again, and retry
--   refuses it. The worker hears of the rotation at once: a notification on the channel
--   `<schema>.stop` carries the job id.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

COMMENT ON SCHEMA {schema} IS 'a jobfence installation: its objects are managed by jobfence migrate';

-- The stopping attempt ------------------------------------------------------------------

ALTER TABLE {schema}.jobs ADD COLUMN stopping_attempt_id uuid;
ALTER TABLE {schema}.jobs ADD COLUMN stopping_until timestamptz;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_stopping_has_deadline
    CHECK ((stopping_attempt_id IS NULL) = (stopping_until IS NULL));

-- The resource stays held while a cancelled attempt is stopping. Same name as before, so
-- that every release maps its violation to "resource busy".
CREATE UNIQUE INDEX jobs_resource_held ON {schema}.jobs (resource)
    WHERE resource IS NOT NULL
      AND (status IN ('waiting', 'pending', 'running') OR stopping_attempt_id IS NOT NULL);
DROP INDEX {schema}.jobs_resource_active;
ALTER INDEX {schema}.jobs_resource_held RENAME TO jobs_resource_active;

-- The sweeper's look for stopping marks whose lease has run out (few rows, ever).
CREATE INDEX jobs_stopping ON {schema}.jobs (stopping_until)
    WHERE stopping_attempt_id IS NOT NULL;

-- Who changed a queue, the drain switch or triggered a function, and why ---------------

CREATE TABLE {schema}.control_events (
    event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    login    text NOT NULL DEFAULT session_user,
    actor    text,
    action   text NOT NULL,
    subject  text,
    detail   jsonb NOT NULL DEFAULT '{{}}'::jsonb
);
CREATE INDEX control_events_at ON {schema}.control_events (at);
