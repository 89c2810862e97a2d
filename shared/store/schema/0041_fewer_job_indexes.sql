-- 0041: three indexes of the jobs table that every write paid for and no query needs.
--
-- * jobs_ready (priority, visible_at) of every queue's pending jobs: kept by 0012 for the
--   pods of the release before queues, which claimed from every queue; every claim since
--   reads its own queue's (jobs_ready_queue), and what counts every queue's ready jobs
--   reads that index whole as well. Each enqueue and each job made pending again wrote an
--   entry into both.
-- * jobs_retention_ttl (retain_until) and jobs_retention_default (finished_at): 0004's
--   page indexes hold the same rows under the same predicates, ordered by the same column
--   first (then job_id), and serve every retention and listing query these did. Each
--   terminal write wrote an entry into both of a pair.
DROP INDEX IF EXISTS {schema}.jobs_ready;
DROP INDEX IF EXISTS {schema}.jobs_retention_ttl;
DROP INDEX IF EXISTS {schema}.jobs_retention_default;
