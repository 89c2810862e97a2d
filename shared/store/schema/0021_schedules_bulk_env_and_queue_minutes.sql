-- 0021: what operators need from the second day on — schedules of users' own work, retry
-- and cancel of a selection, an audited look at a command's environment, and the minutes
-- behind the queue page's chart.
--
-- * Schedules. A schedule is a cron expression in a time zone and the job it enqueues,
--   validated when it is added (jobfence.schedules); `next_tick_at` is the next tick not
--   yet enqueued. The `schedules` pass (the maintainer role) computes the due tick and the
--   one after it, and scheduler_fire enqueues exactly what the schedule's stored job says,
--   once per tick: the schedule's row is moved on only from the tick the pass read (a
--   compare-and-set), the job's idempotency key names the schedule and the tick, and
--   schedule_ticks keeps one row per (schedule, tick). A tick whose job's resource is held
--   is recorded as skipped, never queued behind it. The maintainer never enqueues a job of
--   its own making: only what an operator scheduled, at a tick already due.
-- * Bulk retry and cancel. operator_retry_many and operator_cancel_many do what
--   operator_retry and operator_cancel do, for at most 1,000 jobs in one statement (the
--   caller pages through a selection, a transaction per batch), with the same refusals,
--   answered per job instead of raised.
-- * A command's env values are masked wherever a job is shown; operator_reveal_env hands
--   them to an operator who asks, and records who asked and why (control_events).
-- * job_metric_history: what each fold added, by the minute its transitions committed,
--   kept a day (the fold prunes it): the queue page's chart of jobs finished and run-time
--   percentiles reads it.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

-- Schedules ------------------------------------------------------------------------------

CREATE TABLE {schema}.schedules (
    schedule_id  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name         text NOT NULL UNIQUE
                 CHECK (name ~ '^[a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?$'),
    cron         text NOT NULL CHECK (length(cron) <= 200),
    timezone     text NOT NULL CHECK (length(timezone) <= 100),
    spec         jsonb NOT NULL,
    job          jsonb NOT NULL,
    paused       boolean NOT NULL DEFAULT false,
    next_tick_at timestamptz NOT NULL,
    last_tick_at timestamptz,
    last_job_id  uuid,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text,
    changed_at   timestamptz NOT NULL DEFAULT now(),
    changed_by   text
);
-- The pass's look for due schedules, oldest tick first.
CREATE INDEX schedules_due ON {schema}.schedules (next_tick_at, schedule_id) WHERE NOT paused;

CREATE TABLE {schema}.schedule_ticks (
    schedule_id uuid NOT NULL REFERENCES {schema}.schedules ON DELETE CASCADE,
    tick_at     timestamptz NOT NULL,
    job_id      uuid,
    -- enqueued | resource_busy | exists (a job with the tick's key was already there)
    outcome     text NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (schedule_id, tick_at)
);
CREATE INDEX schedule_ticks_at ON {schema}.schedule_ticks (at);

-- The minutes behind the queue page's chart ----------------------------------------------

ALTER TABLE {schema}.job_metric_deltas ADD COLUMN at timestamptz NOT NULL DEFAULT now();

CREATE TABLE {schema}.job_metric_history (
    minute timestamptz NOT NULL,
    queue  text NOT NULL,
    name   text NOT NULL,
    label  text NOT NULL,
    le     float8 NOT NULL,
    value  float8 NOT NULL,
    PRIMARY KEY (minute, queue, name, label, le)
);
CREATE INDEX job_metric_history_queue ON {schema}.job_metric_history (queue, minute);
