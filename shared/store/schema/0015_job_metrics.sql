-- 0015: job metrics that add up across short-lived pods and survive them.
--
-- Every transition statement (the audit trigger) appends what it adds to the job metrics
-- to job_metric_deltas, aggregated per statement: jobs finished by status, attempts ended
-- by outcome, and the wait (ready -> claimed) and run (claimed -> terminal) histograms,
-- each by queue. The periodic functions fold the deltas into job_metrics (one DELETE ...
-- RETURNING: a delta is folded exactly once, and one committed after a fold waits for the
-- next), and the exposition reads job_metrics. The worker's path pays one small insert per
-- transition statement, never an update of a row every worker would share.
--
-- An attempt's outcome: succeeded, failed, cancelled; retried (given back after a failed
-- action or a run timeout); interrupted (given back on SIGTERM); lost (its fence taken:
-- the lease expired, or its worker pod disappeared or died; the reasons the sweeper and
-- reconciliation write).
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

CREATE TABLE job_metrics (
    queue text NOT NULL,
    -- finished | attempts | wait | run | wait_sum | run_sum
    name  text NOT NULL,
    -- finished: the status; attempts: the outcome; '' otherwise
    label text NOT NULL DEFAULT '',
    -- wait, run: the bucket's upper bound; Infinity otherwise
    le    float8 NOT NULL DEFAULT 'Infinity',
    value float8 NOT NULL,
    PRIMARY KEY (queue, name, label, le)
);

CREATE TABLE job_metric_deltas (
    queue text NOT NULL,
    name  text NOT NULL,
    label text NOT NULL,
    le    float8 NOT NULL,
    value float8 NOT NULL
);
