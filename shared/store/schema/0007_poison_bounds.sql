-- 0007: nothing one job carries can stall the others.
--
-- * Durations are bounded (at most 100 years, positive), so that `now() + ttl` and
--   `now() + timeout` can never overflow a timestamp inside a claim, a terminal write or a
--   reclaim — an overflow there fails the statement for every job it touches. Values
--   written before the bound (wrapped or absurd) are clamped first; the constraints are
--   added NOT VALID here and validated by 0008, in its own transaction, so that the table is
--   not locked against writes while its rows are checked.
-- * `interruptions` counts the SIGTERMs a job took (an eviction, a node drain): those give
--   their attempt back, up to a limit, because they are not the job's fault.
-- * The audit trigger joins its two transition tables; its plan is cached after the first
--   (one-row) statement and stays a nested loop, quadratic in the rows one statement moves
--   (5,000 dependents released at once: 25 million comparisons). Without nested loops the
--   same join is a hash join: linear, and as cheap for one row.
-- Additive: old pods never read the new column and write durations within the bounds.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

UPDATE jobs SET ttl = interval '36500 days'
WHERE ttl IS NOT NULL AND (ttl > interval '36500 days' OR ttl <= interval '0');
UPDATE jobs SET timeout = interval '36500 days'
WHERE timeout IS NOT NULL AND (timeout > interval '36500 days' OR timeout <= interval '0');

ALTER TABLE jobs ADD COLUMN interruptions integer NOT NULL DEFAULT 0;

ALTER TABLE jobs ADD CONSTRAINT jobs_ttl_bounded
    CHECK (ttl IS NULL OR (ttl > interval '0' AND ttl <= interval '36500 days')) NOT VALID;
ALTER TABLE jobs ADD CONSTRAINT jobs_timeout_bounded
    CHECK (timeout IS NULL OR (timeout > interval '0' AND timeout <= interval '36500 days'))
    NOT VALID;
ALTER TABLE jobs ADD CONSTRAINT jobs_interruptions_counted CHECK (interruptions >= 0);
