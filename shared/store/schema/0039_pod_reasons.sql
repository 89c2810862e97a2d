-- 0039: why a worker pod ended, kept with the pass's snapshot of it. A pod whose container
-- was killed for its memory limit (OOMKilled), evicted, or failed to start says so in the
-- reason reconciliation records for the claim it held ("worker pod X is Failed (jobfence:
-- OOMKilled, exit 137)"), not only its phase.
ALTER TABLE {schema}.pod_snapshots ADD COLUMN reason text;
