-- 0020: how long the periodic passes take, and how late what came due is done.
--
-- * Pass durations. Every run of a periodic function that ran (succeeded, failed or
--   interrupted; not a skipped one) adds one to the bucket its duration falls in, kept in
--   the function's totals (`function_totals`, items `duration:<upper bound>` and
--   `duration:sum`): buckets 0.1 s to 120 s, so that p50,
--   p95 and p99 can be read across every pod that ran the function.
-- * Lifecycle lag. The statement that enforces a run timeout, a pending expiry or a
--   retention deletion records, in its own transaction, how long after the job came due it
--   did so (`lifecycle_lag`, label timeout | expiry | retention), measured against the
--   pass's own notion of now.
-- * Finalization lag. The audit trigger records, for a parent that becomes succeeded or
--   failed, how long after its last child ended (`finalize_lag`): whoever finalized it (a
--   periodic pass today, the worker of its last child as well tomorrow) is measured the
--   same way, in the transaction that made it terminal.
--
-- Both lags are histograms by queue in job_metric_deltas, folded by every pass like the
-- wait and run histograms (0015). The maintainer role inserts its own deltas (it already
-- writes the totals they fold into).

CREATE OR REPLACE FUNCTION {schema}.jobfence_buckets(kind text) RETURNS float8[]
LANGUAGE sql IMMUTABLE SET search_path = {schema}, pg_temp AS $$
    SELECT CASE kind
        WHEN 'wait' THEN ARRAY[0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
                               'Infinity']::float8[]
        WHEN 'run' THEN ARRAY[1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400,
                              'Infinity']::float8[]
        WHEN 'pass' THEN ARRAY[0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 'Infinity']::float8[]
        WHEN 'lag' THEN ARRAY[0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
                              21600, 86400, 'Infinity']::float8[]
    END
$$;

CREATE OR REPLACE FUNCTION {schema}.jobfence_bucket(kind text, seconds float8) RETURNS float8
LANGUAGE plpgsql IMMUTABLE SET search_path = {schema}, pg_temp AS $$
DECLARE
    bound float8;
BEGIN
    FOREACH bound IN ARRAY {schema}.jobfence_buckets(kind) LOOP
        IF seconds <= bound THEN
            RETURN bound;
        END IF;
    END LOOP;
    RETURN 'Infinity';
END
$$;

-- One observation of a histogram, as the rows it adds: one to the bucket `seconds` falls in
-- (a negative value counts as 0), and `seconds` to `<name>_sum`.
CREATE FUNCTION {schema}.jobfence_observation(p_name text, p_buckets text, p_seconds float8)
RETURNS TABLE (name text, le float8, value float8)
LANGUAGE sql IMMUTABLE SET search_path = {schema}, pg_temp AS $$
    SELECT p_name, {schema}.jobfence_bucket(p_buckets, greatest(p_seconds, 0)), 1::float8
    UNION ALL
    SELECT p_name || '_sum', 'Infinity'::float8, greatest(p_seconds, 0)
$$;

-- The audit trigger of 0019, plus the finalization lag of a parent.
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
    ) m
    GROUP BY m.queue, m.name, m.label, m.le;
    RETURN NULL;
END
$$;
