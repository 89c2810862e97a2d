-- 0002: what orphan-cleanup remembers between passes.
--
-- A running worker pod that holds no live claim is only an orphan if it stays so: a pod
-- between two jobs, or exiting after its last one, holds none for a moment. Each pass
-- records the pods it suspects; a pod is deleted only when a pass finds it still suspect
-- after the grace period since it was first seen. One row per suspect pod, so the table is
-- bounded by the number of worker pods.
CREATE TABLE orphan_pod_suspects (
    name       text PRIMARY KEY,
    job_name   text,
    first_seen timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL
);
