-- 0013: nothing that needs a session of its own, so that every function works through a
-- transaction pooler (PgBouncer's transaction mode lends a server connection for one
-- transaction at a time).
--
-- * function_leases: one run of a periodic function at a time. A session-level advisory
--   lock was taken on whichever server connection the pooler lent and stayed there; a
--   lease row holds through any pooler. A run takes the row when it is free or its lease
--   has run out (INSERT ... ON CONFLICT DO UPDATE ... WHERE expired: of two runs at the
--   same moment exactly one gets a row back), renews it every third of the lease while
--   it runs, and deletes it when it ends, each predicated on its own holder id (a fence of
--   its own: a run that lost its lease can neither renew nor release the next one's).
--   run_id is the run record of the holder; previous_run_id, set when a lease is taken
--   over after it ran out, names a run that was killed before it could record its end.
-- * function_runs.status gains 'interrupted': a run stopped by SIGTERM, or found
--   abandoned (killed) by the next run.
-- * pod_snapshots: a pass's view of the worker pods, page by page, so that the comparison
--   with the claims runs in the database. It was a temporary table, which lives in one
--   server session; rows of a snapshot are now keyed by the pass's holder id and deleted
--   when the pass ends (a killed pass's are deleted by a later one after an hour).
CREATE TABLE function_leases (
    function        text PRIMARY KEY,
    holder          uuid NOT NULL,
    run_id          bigint,
    previous_run_id bigint,
    taken_at        timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
);

ALTER TABLE function_runs DROP CONSTRAINT function_runs_status_check;
ALTER TABLE function_runs ADD CONSTRAINT function_runs_status_check
    CHECK (status IN ('running', 'succeeded', 'failed', 'skipped', 'interrupted'));

CREATE TABLE pod_snapshots (
    snapshot_id uuid NOT NULL,
    name        text NOT NULL,
    phase       text NOT NULL,
    created_at  timestamptz,
    started_at  timestamptz,
    job_name    text,
    deleting    boolean NOT NULL,
    listed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (snapshot_id, name)
);
CREATE INDEX pod_snapshots_listed ON pod_snapshots (listed_at);
