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

CREATE FUNCTION jobfence_buckets(kind text) RETURNS float8[] LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE kind
        WHEN 'wait' THEN ARRAY[0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
                               'Infinity']::float8[]
        WHEN 'run' THEN ARRAY[1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400,
                              'Infinity']::float8[]
    END
$$;

-- The upper bound of the bucket a value falls in (buckets are stored per bucket; the
-- exposition adds them up into Prometheus' cumulative ones). PL/pgSQL, so that it is called,
-- never inlined into the trigger's statement as a subquery to plan.
CREATE FUNCTION jobfence_bucket(kind text, seconds float8) RETURNS float8
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bound float8;
BEGIN
    FOREACH bound IN ARRAY jobfence_buckets(kind) LOOP
        IF seconds <= bound THEN
            RETURN bound;
        END IF;
    END LOOP;
    RETURN 'Infinity';
END
$$;

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

CREATE OR REPLACE FUNCTION jobfence_audit_update() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT SET enable_nestloop = off AS $$
BEGIN
    INSERT INTO job_events (job_id, from_status, to_status, attempt_id, reason)
    SELECT n.job_id, o.status, n.status, coalesce(o.attempt_id, n.attempt_id), n.reason
    FROM old_rows o JOIN new_rows n USING (job_id)
    WHERE o.status IS DISTINCT FROM n.status OR o.attempt_id IS DISTINCT FROM n.attempt_id;
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.finished', n.job_id::text)
    FROM new_rows n JOIN job_watchers w ON w.job_id = n.job_id
    WHERE n.status IN ('succeeded', 'failed', 'cancelled');
    -- What the statement adds to the job metrics, one row per (queue, metric, bucket); no
    -- join but the one above (this function plans without nested loops).
    WITH t AS MATERIALIZED (
        SELECT n.queue, o.status AS was, n.status AS now, n.reason,
               CASE WHEN o.status = 'pending' AND n.status = 'running'
                    THEN greatest(0, extract(epoch FROM n.claimed_at - o.visible_at))
               END AS waited,
               CASE WHEN o.status = 'running' AND n.status IN ('succeeded', 'failed', 'cancelled')
                    THEN greatest(0, extract(epoch FROM clock_timestamp() - o.claimed_at))
               END AS ran
        FROM old_rows o JOIN new_rows n USING (job_id)
        WHERE o.status IS DISTINCT FROM n.status
    )
    INSERT INTO job_metric_deltas (queue, name, label, le, value)
    SELECT m.queue, m.name, m.label, m.le, sum(m.value)
    FROM (
        SELECT queue, 'finished' AS name, now AS label, 'Infinity'::float8 AS le,
               1::float8 AS value
        FROM t WHERE now IN ('succeeded', 'failed', 'cancelled')
        UNION ALL
        SELECT queue, 'attempts',
               CASE WHEN now IN ('succeeded', 'cancelled') THEN now
                    WHEN reason LIKE 'lease expired%' OR reason LIKE 'worker pod %' THEN 'lost'
                    WHEN now = 'pending' AND reason = 'worker received SIGTERM'
                    THEN 'interrupted'
                    WHEN now = 'pending' THEN 'retried'
                    ELSE 'failed' END,
               'Infinity', 1
        FROM t WHERE was = 'running'
        UNION ALL
        SELECT queue, 'wait', '', jobfence_bucket('wait', waited), 1
        FROM t WHERE waited IS NOT NULL
        UNION ALL
        SELECT queue, 'wait_sum', '', 'Infinity', waited FROM t WHERE waited IS NOT NULL
        UNION ALL
        SELECT queue, 'run', '', jobfence_bucket('run', ran), 1 FROM t WHERE ran IS NOT NULL
        UNION ALL
        SELECT queue, 'run_sum', '', 'Infinity', ran FROM t WHERE ran IS NOT NULL
    ) m
    GROUP BY m.queue, m.name, m.label, m.le;
    RETURN NULL;
END
$$;
