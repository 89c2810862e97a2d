-- 0036: stops counted. An action a worker stopped because it went quiet for its inactivity
-- timeout (or ran past its job's timeout) is counted by the audit trigger, by queue and
-- why (`stops`, label inactive | timed_out), folded with the other job metrics and
-- exported as jobfence_job_stops_total: a command that hangs without output shows on the
-- dashboard as such, not only as one more retry. The trigger is 0020's, plus that row.

CREATE OR REPLACE FUNCTION {schema}.jobfence_audit_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp
SET enable_nestloop = off AS $$
BEGIN
    INSERT INTO {schema}.job_events (job_id, from_status, to_status, attempt_id, reason)
    SELECT n.job_id, o.status, n.status, coalesce(o.attempt_id, n.attempt_id), n.reason
    FROM old_rows o JOIN new_rows n USING (job_id)
    WHERE o.status IS DISTINCT FROM n.status OR o.attempt_id IS DISTINCT FROM n.attempt_id;
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.finished', n.job_id::text)
    FROM new_rows n JOIN {schema}.job_watchers w ON w.job_id = n.job_id
    WHERE n.status IN ('succeeded', 'failed', 'cancelled');
    -- What the statement adds to the job metrics, one row per (queue, metric, bucket); no
    -- join but the one above (this function plans without nested loops). A parent's
    -- finalization looks up when its last child ended: once per parent, by its children's
    -- index, in the transaction that finalizes it.
    WITH t AS MATERIALIZED (
        SELECT n.queue, o.status AS was, n.status AS now, n.reason,
               CASE WHEN o.status = 'pending' AND n.status = 'running'
                    THEN greatest(0, extract(epoch FROM n.claimed_at - o.visible_at))
               END AS waited,
               CASE WHEN o.status = 'running' AND n.status IN ('succeeded', 'failed', 'cancelled')
                    THEN greatest(0, extract(epoch FROM clock_timestamp() - o.claimed_at))
               END AS ran,
               CASE WHEN n.is_parent AND o.status = 'running'
                         AND n.status IN ('succeeded', 'failed')
                    THEN greatest(0, extract(epoch FROM clock_timestamp() - (
                        SELECT max(c.finished_at) FROM {schema}.jobs c
                        WHERE c.parent_id = n.job_id)))
               END AS finalized_after
        FROM old_rows o JOIN new_rows n USING (job_id)
        WHERE o.status IS DISTINCT FROM n.status
    )
    INSERT INTO {schema}.job_metric_deltas (queue, name, label, le, value)
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
        SELECT queue, 'wait', '', {schema}.jobfence_bucket('wait', waited), 1
        FROM t WHERE waited IS NOT NULL
        UNION ALL
        SELECT queue, 'wait_sum', '', 'Infinity', waited FROM t WHERE waited IS NOT NULL
        UNION ALL
        SELECT queue, 'run', '', {schema}.jobfence_bucket('run', ran), 1
        FROM t WHERE ran IS NOT NULL
        UNION ALL
        SELECT queue, 'run_sum', '', 'Infinity', ran FROM t WHERE ran IS NOT NULL
        UNION ALL
        SELECT queue, 'finalize_lag', '', {schema}.jobfence_bucket('lag', finalized_after), 1
        FROM t WHERE finalized_after IS NOT NULL
        UNION ALL
        SELECT queue, 'finalize_lag_sum', '', 'Infinity', finalized_after
        FROM t WHERE finalized_after IS NOT NULL
        UNION ALL
        -- A worker that stopped an action for going quiet (or past the job's timeout)
        -- gives the job back with that reason: pending for a retry, or failed.
        SELECT queue, 'stops', CASE reason WHEN 'inactive' THEN 'inactive'
                                           ELSE 'timed_out' END, 'Infinity', 1
        FROM t WHERE was = 'running' AND now IN ('pending', 'failed')
                 AND reason IN ('inactive', 'timed out')
    ) m
    GROUP BY m.queue, m.name, m.label, m.le;
    RETURN NULL;
END
$$;
