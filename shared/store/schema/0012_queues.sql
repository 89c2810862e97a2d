-- 0012: queues, scheduled jobs, and queue settings.
--
-- * Every job belongs to one queue (a DNS label; `default` for every job before this), and
--   a worker serves one: the claim reads the ready rows of its queue only, through
--   jobs_ready_queue. jobs_ready stays for the previous release's pods during a rolling
--   deploy (they claim from every queue) and goes in a later release.
-- * run_at: when a scheduled job may start (its visible_at until then); NULL when it was
--   not scheduled.
-- * queues: a queue's settings, when it has any: paused (claims nothing, the KEDA query
--   reads 0; enqueues go on) and max_running (running jobs of the queue across every pod,
--   enforced by the claim: see attempts.sql).
-- Building these indexes reads the whole table; on a large one, upgrade with drain on.
ALTER TABLE jobs ADD COLUMN queue text NOT NULL DEFAULT 'default'
    CONSTRAINT jobs_queue_name CHECK (queue ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$');
ALTER TABLE jobs ADD COLUMN run_at timestamptz;

CREATE INDEX jobs_ready_queue ON jobs (queue, priority DESC, visible_at)
    WHERE status = 'pending';
CREATE INDEX jobs_running_queue ON jobs (queue) WHERE status = 'running' AND NOT is_parent;
CREATE INDEX jobs_active_queue ON jobs (queue, status)
    WHERE status IN ('waiting', 'pending', 'running');

CREATE TABLE queues (
    name        text PRIMARY KEY
        CONSTRAINT queues_name CHECK (name ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),
    paused      boolean NOT NULL DEFAULT false,
    max_running integer CONSTRAINT queues_max_running CHECK (max_running >= 0),
    reason      text,
    changed_at  timestamptz NOT NULL DEFAULT now()
);
