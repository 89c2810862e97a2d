-- 0006: whether anything waits on a job, on the job itself.
--
-- A job that becomes terminal must settle the jobs waiting on it, after its commit. Most
-- jobs have no dependents, and asking the dependency table after every terminal write costs
-- a round trip per job. Enqueueing a job `after` others now sets this flag on each of them,
-- in the enqueue's transaction: that UPDATE and the dependency's terminal write lock the
-- same row, so whichever comes second sees the other — a terminal write that follows sees
-- the flag in its own RETURNING, and an enqueue that follows sees the dependency terminal
-- and settles its new job itself. Additive: the default costs no table rewrite; jobs that
-- already have dependents are marked here.
ALTER TABLE jobs ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;
UPDATE jobs SET has_dependents = true
WHERE job_id IN (SELECT depends_on FROM job_dependencies);
