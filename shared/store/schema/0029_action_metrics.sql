-- 0029: action metrics by queue and action (docs/DESIGN.md, "Metrics by action").
--
-- * What is observed: every action outcome a worker stores (a row of job_action_results,
--   written by worker_record_action, worker_finish, worker_finish_many or worker_release,
--   each only under its attempt's fence) adds one run by outcome (succeeded, failed), its
--   run time (started -> stored) to a histogram, and — when its result carries a `usage`
--   object with `cpu_seconds` and `peak_memory_bytes` — each number it carries to a
--   histogram of its own. A write that lost its fence stores no row and observes nothing;
--   the same action written again (a write retried after its outcome was lost with the
--   connection) updates its row and observes nothing more: one run, one observation.
-- * How: a statement-level trigger on job_action_results appends what the statement adds
--   to action_metric_deltas, one row per (queue, action, metric, bucket) — insert-only, so
--   that no two workers ever wait on one row — and every periodic pass folds the deltas
--   into action_metrics (one DELETE ... RETURNING, exactly once), as 0015 does for jobs.
-- * Bounded labels: an action's label is its name only when a worker registered that name
--   (worker_register_actions, once per worker process: the names of its registry, built-ins
--   and installed plugins); any other name (a job enqueued around the registry, a plugin
--   no worker has any more) counts as `other`. The table of names keeps at most 1000; a
--   name no worker registered for 30 days is forgotten by the fold, with its totals.
--
-- Additive: old workers write results as before (their names count once a new worker has
-- registered them; the built-ins are known from the start).
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

CREATE TABLE {schema}.action_names (
    name          text PRIMARY KEY,
    registered_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {schema}.action_names (name) VALUES ('command'), ('sleep');

CREATE TABLE {schema}.action_metrics (
    queue  text NOT NULL,
    -- a registered action's name, or 'other'
    action text NOT NULL,
    -- runs | run | run_sum | cpu | cpu_sum | memory | memory_sum
    name   text NOT NULL,
    -- runs: the outcome (succeeded, failed); '' otherwise
    label  text NOT NULL DEFAULT '',
    -- run, cpu, memory: the bucket's upper bound; Infinity otherwise
    le     float8 NOT NULL DEFAULT 'Infinity',
    value  float8 NOT NULL,
    PRIMARY KEY (queue, action, name, label, le)
);

CREATE TABLE {schema}.action_metric_deltas (
    queue  text NOT NULL,
    action text NOT NULL,
    name   text NOT NULL,
    label  text NOT NULL,
    le     float8 NOT NULL,
    value  float8 NOT NULL
);
