-- 0028: an action may ask to run again later without spending an attempt (a snooze), as
-- River's JobSnooze and Oban's {{:snooze, seconds}} do; a job cannot snooze forever unnoticed.
--
-- * jobs.snoozes counts the snoozes a job took. Like `interruptions` it is a count of
--   attempts given back without being spent; unlike them a snooze is the job's own choice,
--   so past the bound it fails the job outright (no attempt would do better).
-- * worker_snooze: the holder of the fence (and a live lease) gives its job back to
--   `pending`, visible again after the delay, the attempt not counted and the snooze counted;
--   or, when the job has snoozed p_max_snoozes times already, `failed` with why. The audit
--   trigger records the transition with its reason ("snoozed for ..."), which names the
--   delay and the action. The actions this attempt finished before stay recorded: the next
--   claim resumes after them.
-- * worker_claim's `interruptions` column now counts every claim given back without being
--   spent (SIGTERMs and snoozes): the worker reads it only to know whether an earlier claim
--   may have finished some actions (then it asks which). Same columns, same types.
--
-- Additive: an old worker never snoozes; it reads the claim's columns as before.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

ALTER TABLE {schema}.jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0
    CONSTRAINT jobs_snoozes_counted CHECK (snoozes >= 0);

-- A job is born without snoozes, as without interruptions (0019's jobs_born_fresh).
DROP TRIGGER IF EXISTS jobs_born_fresh ON {schema}.jobs;
