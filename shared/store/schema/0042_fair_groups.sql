-- 0042: groups (tenants) inside a queue — a limit on each group's running jobs, and claims
-- round-robin across groups.
--
-- * jobs.group_key: the job spec's `group` (NULL when it has none; a datum's is its
--   parent's). 1 to 128 letters, digits and `-_.:@/`, starting and ending with a letter or
--   digit.
-- * queues.group_limit: at most this many running jobs of each group of the queue (the jobs
--   without a group count as one group); queues.fair: claim round-robin across the groups,
--   each group's next job in turn (priority order within a group); queues.fair_cursor: the
--   group the last fair claim served ('' for the jobs without a group), where the next one
--   goes on from. Both enforced by the claim, under the queue's lock (attempts.functions.sql).
-- * jobs_ready_group: a queue's ready jobs by group ('' for the jobs without one), in the
--   order a group's jobs are claimed: a claim of a queue with groups walks it a group at a
--   time. jobs_running_group counts a group's running jobs for its limit, and a queue's
--   (its first column): it replaces jobs_running_queue.
-- Building the indexes reads the whole table; on a large one, upgrade with drain on.
ALTER TABLE {schema}.jobs ADD COLUMN group_key text
    CONSTRAINT jobs_group_key CHECK (group_key ~ '^[A-Za-z0-9]([-A-Za-z0-9_.:@/]{{0,126}}[A-Za-z0-9])?$');

ALTER TABLE {schema}.queues
    ADD COLUMN group_limit integer CONSTRAINT queues_group_limit CHECK (group_limit >= 0),
    ADD COLUMN fair boolean NOT NULL DEFAULT false,
    ADD COLUMN fair_cursor text;

CREATE INDEX jobs_ready_group
    ON {schema}.jobs (queue, coalesce(group_key, ''), priority DESC, visible_at)
    WHERE status = 'pending';
CREATE INDEX jobs_running_group ON {schema}.jobs (queue, coalesce(group_key, ''))
    WHERE status = 'running' AND NOT is_parent;
DROP INDEX {schema}.jobs_running_queue;
