-- Schedules of users' own work: what `jobfence schedule` changes and the `schedules` pass
-- reads and fires (scheduler_fire in schedules.functions.sql; migration 0021 says how a
-- tick is enqueued exactly once).
-- Named statements, run by the method of the same name in store/schedules.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- add --
-- A new schedule, recorded with who added it: operator_schedule_add.
SELECT schedule_id, name, cron, timezone, spec, paused, next_tick_at, last_tick_at,
    last_job_id, created_at, created_by, changed_at, changed_by
FROM {schema}.operator_schedule_add(%(name)s::text, %(cron)s::text, %(timezone)s::text,
                                    %(spec)s::jsonb, %(job)s::jsonb,
                                    %(next_tick_at)s::timestamptz, %(actor)s::text);

-- set_paused --
-- Pause or resume a schedule (a resume starts from the given tick), recorded.
SELECT schedule_id, name, cron, timezone, spec, paused, next_tick_at, last_tick_at,
    last_job_id, created_at, created_by, changed_at, changed_by
FROM {schema}.operator_schedule_pause(%(name)s::text, %(paused)s::boolean,
                                      %(next_tick_at)s::timestamptz, %(actor)s::text);

-- delete --
-- Delete a schedule and its record of ticks, recorded.
SELECT schedule_id, name, cron, timezone, spec, paused, next_tick_at, last_tick_at,
    last_job_id, created_at, created_by, changed_at, changed_by
FROM {schema}.operator_schedule_delete(%(name)s::text, %(actor)s::text);

-- get --
-- One schedule by name.
SELECT schedule_id, name, cron, timezone, spec, paused, next_tick_at, last_tick_at,
    last_job_id, created_at, created_by, changed_at, changed_by
FROM {schema}.schedules WHERE name = %(name)s;

-- page --
-- Schedules by name, a page at a time (after: the last name of the previous page).
SELECT schedule_id, name, cron, timezone, spec, paused, next_tick_at, last_tick_at,
    last_job_id, created_at, created_by, changed_at, changed_by
FROM {schema}.schedules
WHERE (%(after)s::text IS NULL OR name > %(after)s)
ORDER BY name LIMIT %(limit)s;

-- ticks --
-- A schedule's most recent recorded ticks, newest first.
SELECT t.tick_at, t.job_id, t.outcome, t.at
FROM {schema}.schedule_ticks t JOIN {schema}.schedules s USING (schedule_id)
WHERE s.name = %(name)s ORDER BY t.tick_at DESC LIMIT %(limit)s;

-- due --
-- A batch of schedules whose next tick has come by the database's clock, oldest tick
-- first (keyset after the last of the previous batch).
SELECT schedule_id, name, cron, timezone, next_tick_at,
    coalesce(job ->> 'queue', 'default') AS queue
FROM {schema}.schedules
WHERE NOT paused AND next_tick_at <= coalesce(%(now)s::timestamptz, clock_timestamp())
  AND (%(after_tick)s::timestamptz IS NULL
       OR (next_tick_at, schedule_id) > (%(after_tick)s::timestamptz, %(after_id)s::uuid))
ORDER BY next_tick_at, schedule_id
LIMIT %(limit)s;

-- fire --
-- Enqueue a batch of due ticks, each exactly once: scheduler_fire.
SELECT schedule_id, name, tick_at, job_id, outcome
FROM {schema}.scheduler_fire(%(schedule_ids)s::uuid[], %(expected)s::timestamptz[],
                             %(ticks)s::timestamptz[], %(following)s::timestamptz[],
                             %(job_ids)s::uuid[], %(traceparents)s::text[]);

-- clock --
-- The database's clock (ticks are judged by it, not by the pass's).
SELECT clock_timestamp() AS now;
