-- 0022: a pod is judged and deleted as the one object that was listed. Names are reused (a
-- Job re-created under its name, a pod of a StatefulSet-like controller): a snapshot row
-- and a suspect now carry the pod's uid and its Job's, orphan-cleanup deletes with those
-- as preconditions, and a suspect whose name now belongs to another pod starts over.
ALTER TABLE {schema}.pod_snapshots ADD COLUMN uid text, ADD COLUMN job_uid text;
ALTER TABLE {schema}.orphan_pod_suspects ADD COLUMN uid text, ADD COLUMN job_uid text;
