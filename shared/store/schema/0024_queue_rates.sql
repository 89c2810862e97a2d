-- 0024: a queue's rate — at most N of its jobs start in any window of a period (a second
-- to a day), across every pod, as pgqueuer's rate limit and Oban's do. The claim enforces
-- it in the database like the limit on running jobs: under the queue's transaction lock it
-- counts the starts recorded within the last period, claims at most what is left, and
-- records its own starts (a row per claimed job at its `claimed_at` — in a rate-limited
-- queue the clock of the claim itself rather than of its transaction's start, so that a
-- claim that waited for the lock is dated after the claims it waited for) before the lock
-- is let go, so no two claims ever count the same room. Rows older than the period are deleted by
-- the claim that finds them: the table holds at most N rows per rate-limited queue.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

ALTER TABLE {schema}.queues
    ADD COLUMN rate_limit integer CONSTRAINT queues_rate_limit CHECK (rate_limit >= 0),
    ADD COLUMN rate_period interval CONSTRAINT queues_rate_period
        CHECK (rate_period BETWEEN interval '1 second' AND interval '1 day'),
    ADD CONSTRAINT queues_rate_whole CHECK ((rate_limit IS NULL) = (rate_period IS NULL));

CREATE TABLE {schema}.queue_starts (
    queue      text NOT NULL,
    started_at timestamptz NOT NULL
);
CREATE INDEX queue_starts_queue_at ON {schema}.queue_starts (queue, started_at);
