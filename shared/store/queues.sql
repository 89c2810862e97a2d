-- The queue at a glance: what the KEDA trigger and the gauges read.
-- Named statements, run by the method of the same name in store/queues.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- scaler_value --
-- The KEDA ScaledJob's postgresql trigger (manifests/ embeds this same text). KEDA's default
-- scaling strategy starts ceil(value / target) minus the Jobs already running, so the value
-- counts ready work plus live claims; 0 while draining. Two partial-index scans, however
-- many finished jobs the table holds.
SELECT CASE WHEN (SELECT draining FROM {schema}.jobfence_control) THEN 0
    ELSE (SELECT count(*) FROM {schema}.jobs WHERE status = 'pending' AND visible_at <= now())
       + (SELECT count(*) FROM {schema}.jobs WHERE status = 'running' AND NOT is_parent)
    END AS value;

-- gauges --
-- The queue at a glance, each part an index scan: active jobs by status (top-level waiting
-- jobs; children wait on their parent), the age of the oldest ready job, drain mode.
SELECT
    (SELECT count(*) FROM {schema}.jobs WHERE status = 'waiting' AND parent_id IS NULL) AS waiting,
    (SELECT count(*) FROM {schema}.jobs WHERE status = 'pending') AS pending,
    (SELECT count(*) FROM {schema}.jobs WHERE status = 'running' AND NOT is_parent) AS running,
    (SELECT coalesce(extract(epoch FROM now() - min(visible_at)), 0)::float8 FROM {schema}.jobs
     WHERE status = 'pending' AND visible_at <= now()) AS oldest_ready_age_seconds,
    (SELECT draining FROM {schema}.jobfence_control) AS draining;
