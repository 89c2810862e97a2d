-- 0011: the installation's identity.
--
-- Everything an installation creates outside its database carries it: its worker pods (a
-- label its cluster adapter adds to every selector), its local worker processes (their
-- environment), its objects on S3 (under jobfence/<installation>/). orphan-cleanup and
-- reconciliation only ever look at what carries their own, so two installations sharing a
-- namespace, a machine or a bucket never touch each other. `jobfence migrate` fills it in
-- once — JOBFENCE_INSTALLATION when set, a generated name otherwise — and it never changes.
-- identified_at tells which jobs may have objects from before (under jobfence/<job>/):
-- retention still deletes those with their job.
ALTER TABLE jobfence_control ADD COLUMN installation text
    CONSTRAINT jobfence_control_installation_name
    CHECK (installation ~ '^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$');
ALTER TABLE jobfence_control ADD COLUMN identified_at timestamptz;
