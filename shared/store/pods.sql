-- The cluster compared with the claims: a pass's snapshot of the worker pods, suspects, the object owners.
-- Named statements, run by the method of the same name in store/pods.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- snapshot_forget_stale --
-- Rows of snapshots whose pass was killed before it could delete them (a pass lasts
-- minutes; an hour is long past any).
DELETE FROM {schema}.pod_snapshots WHERE listed_at < now() - interval '1 hour';

-- snapshot_forget --
-- A pass's snapshot, when it begins again or ends.
DELETE FROM {schema}.pod_snapshots WHERE snapshot_id = %(snapshot)s;

-- snapshot_add --
-- Add one page of listed pods to the pass's snapshot (a pod listed twice keeps its last
-- state).
INSERT INTO {schema}.pod_snapshots (snapshot_id, name, phase, created_at, started_at,
    job_name, deleting, uid, job_uid, reason)
SELECT %(snapshot)s, x.name, x.phase, x.created_at, x.started_at, x.job_name, x.deleting,
    x.uid, x.job_uid, left(x.reason, 500)
FROM jsonb_to_recordset(%(pods)s::jsonb) AS x (
    name text, phase text, created_at timestamptz, started_at timestamptz, job_name text,
    deleting boolean, uid text, job_uid text, reason text)
ON CONFLICT (snapshot_id, name) DO UPDATE SET phase = excluded.phase,
    created_at = excluded.created_at, started_at = excluded.started_at,
    job_name = excluded.job_name, deleting = excluded.deleting, uid = excluded.uid,
    job_uid = excluded.job_uid, reason = excluded.reason;

-- now --
-- The database's clock, or the injected one: when a listing began.
SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now;

-- reclaim_dead_claims --
-- Live claims whose worker pod is gone from the snapshot, or has finished or gone Unknown,
-- in a bounded batch: rotate the fence, retry with backoff, or fail once attempts are
-- exhausted (jobfence_reclaim). Judged only for claimers the cluster can vouch for, and
-- only for claims made before the listing began minus a grace period; a pod that started
-- after the claim is a new process under a reused name, so the claimer is gone.
WITH dead AS (
    SELECT j.job_id,
        (p.name IS NULL OR p.started_at > j.claimed_at + interval '1 second') AS missing,
        CASE WHEN p.name IS NULL OR p.started_at > j.claimed_at + interval '1 second'
             THEN 'worker pod ' || j.claimed_by || ' disappeared'
             ELSE 'worker pod ' || j.claimed_by || ' is ' || p.phase
                  || coalesce(' (' || p.reason || ')', '') END AS why,
        -- A pod whose node stopped answering may still run the command: its attempt is
        -- kept as stopping (invariant 12) until its lease has run out.
        coalesce(p.phase = 'Unknown' AND p.started_at <= j.claimed_at + interval '1 second',
                 false) AS alive
    FROM {schema}.jobs j LEFT JOIN {schema}.pod_snapshots p
        ON p.snapshot_id = %(snapshot)s AND p.name = j.claimed_by
    WHERE j.status = 'running' AND NOT j.is_parent
      AND j.claimed_by ~ %(claimer_pattern)s
      AND j.claimed_at < %(listed_at)s::timestamptz - make_interval(secs => %(grace_seconds)s)
      AND (p.name IS NULL OR p.phase IN ('Succeeded', 'Failed', 'Unknown')
           OR p.started_at > j.claimed_at + interval '1 second')
    ORDER BY j.job_id
    LIMIT %(batch_size)s
    FOR UPDATE OF j SKIP LOCKED
)
SELECT r.job_id, r.status, r.parent_id, d.missing
FROM {schema}.jobfence_reclaim(
    ARRAY(SELECT job_id FROM dead ORDER BY job_id),
    ARRAY(SELECT why FROM dead ORDER BY job_id),
    ARRAY(SELECT why FROM dead ORDER BY job_id),
    %(base_seconds)s, %(cap_seconds)s,
    ARRAY(SELECT alive FROM dead ORDER BY job_id)) AS r
JOIN dead d ON d.job_id = r.job_id;

-- unverifiable_claims --
-- Live claims by workers the cluster cannot vouch for (e.g. run by hand outside it).
SELECT count(*) AS n FROM {schema}.jobs
WHERE status = 'running' AND NOT is_parent AND claimed_by !~ %(claimer_pattern)s;

-- unclaimed_pods --
-- Running worker pods in the snapshot, started before the grace period, holding no live
-- claim; a page in name order.
SELECT p.name, p.job_name, p.uid, p.job_uid FROM {schema}.pod_snapshots p
WHERE p.snapshot_id = %(snapshot)s AND p.phase = 'Running' AND NOT p.deleting
  AND coalesce(p.started_at, p.created_at) < %(listed_at)s::timestamptz - make_interval(secs => %(grace_seconds)s)
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.status = 'running' AND NOT j.is_parent
                  AND j.claimed_by = p.name)
  AND p.name > %(after)s
ORDER BY p.name
LIMIT %(limit)s;

-- note_suspects --
-- Remember a page of unclaimed pods: first seen now, or seen again — unless the name now
-- belongs to another pod (another uid), which starts its own grace period.
INSERT INTO {schema}.orphan_pod_suspects (name, job_name, first_seen, last_seen, uid, job_uid)
SELECT x.name, x.job_name, %(listed_at)s, %(listed_at)s, x.uid, x.job_uid
FROM jsonb_to_recordset(%(pods)s::jsonb) AS x (name text, job_name text, uid text,
    job_uid text)
ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen,
    job_name = excluded.job_name, job_uid = excluded.job_uid, uid = excluded.uid,
    first_seen = CASE WHEN orphan_pod_suspects.uid IS DISTINCT FROM excluded.uid
                      THEN excluded.first_seen ELSE orphan_pod_suspects.first_seen END
RETURNING name, job_name, first_seen, uid, job_uid;

-- forget_suspects --
-- Suspects not seen unclaimed by this pass (they claimed work, or are gone).
DELETE FROM {schema}.orphan_pod_suspects WHERE last_seen < %(listed_at)s;

-- confirm_suspect --
-- Just before deleting a suspect: drop it from the suspects if it holds a live claim now.
DELETE FROM {schema}.orphan_pod_suspects s
WHERE s.name = %(name)s
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.status = 'running' AND NOT j.is_parent
                  AND j.claimed_by = s.name)
RETURNING s.name;

-- finished_pods_beyond_history --
-- Finished worker pods older than the newest %(keep)s, holding no live claim (those are
-- reconciliation's), a page in name order.
WITH ranked AS (
    SELECT p.name, p.job_name, p.uid, p.job_uid, row_number() OVER (
        ORDER BY coalesce(p.started_at, p.created_at) DESC NULLS LAST, p.name) AS rn
    FROM {schema}.pod_snapshots p
    WHERE p.snapshot_id = %(snapshot)s AND p.phase IN ('Succeeded', 'Failed')
      AND NOT p.deleting
)
SELECT r.name, r.job_name, r.uid, r.job_uid FROM ranked r
WHERE r.rn > %(keep)s AND r.name > %(after)s
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.status = 'running' AND NOT j.is_parent
                  AND j.claimed_by = r.name)
ORDER BY r.name
LIMIT %(limit)s;

-- object_owners --
-- For a page of (job, attempt) pairs parsed from object keys under jobfence/: 'keep' for a
-- job's own files (no attempt: the manifest, the logs), the live claim's and the committed
-- attempt's outputs, and those of every earlier attempt that finished an action of the
-- job's current run while the job may still use or list them (a resumed run skipped those
-- actions: their files are its outputs); 'garbage' for any other attempt's (fenced out,
-- failed, cancelled, of a run before a retry); 'gone' when the job no longer exists.
SELECT x.job_id, x.attempt_id,
    CASE WHEN j.job_id IS NULL THEN 'gone'
         WHEN x.attempt_id IS NULL THEN 'keep'
         WHEN j.attempt_id = x.attempt_id AND j.status IN ('running', 'succeeded')
             THEN 'keep'
         WHEN j.status IN ('waiting', 'pending', 'running', 'succeeded')
              AND EXISTS (SELECT FROM {schema}.job_action_results r
                          WHERE r.job_id = j.job_id AND r.attempt_id = x.attempt_id
                            AND r.status = 'succeeded' AND r.run = j.run)
             THEN 'keep'
         ELSE 'garbage' END AS verdict
FROM jsonb_to_recordset(%(pairs)s::jsonb) AS x (job_id uuid, attempt_id uuid)
LEFT JOIN {schema}.jobs j ON j.job_id = x.job_id;
