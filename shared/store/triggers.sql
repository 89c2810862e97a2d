-- request --
-- Take the function's slot when `interval` seconds have passed since its last trigger, and
-- record the request (who, why) in the same statement; no row when the slot is taken.
WITH slot AS (
    INSERT INTO {schema}.function_trigger_slots AS s (function, last_at)
    VALUES (%(function)s, clock_timestamp())
    ON CONFLICT (function) DO UPDATE SET last_at = excluded.last_at
    WHERE s.last_at <= excluded.last_at - make_interval(secs => %(interval)s)
    RETURNING function, last_at
)
INSERT INTO {schema}.function_triggers (function, requested_by, reason, requested_at)
SELECT function, %(requested_by)s, %(reason)s, last_at FROM slot
RETURNING trigger_id, function, requested_by, reason, requested_at, outcome, job_name, error;

-- next_allowed --
-- When the function's slot frees up (null when it is free now).
SELECT last_at + make_interval(secs => %(interval)s) AS at
FROM {schema}.function_trigger_slots
WHERE function = %(function)s AND last_at + make_interval(secs => %(interval)s) > clock_timestamp();

-- created --
-- The cluster created the trigger's Job.
UPDATE {schema}.function_triggers SET outcome = 'created', job_name = %(job_name)s
WHERE trigger_id = %(trigger_id)s
RETURNING trigger_id, function, requested_by, reason, requested_at, outcome, job_name, error;

-- failed --
-- The cluster refused the trigger: record why and hand the slot back.
WITH t AS (
    UPDATE {schema}.function_triggers SET outcome = 'failed', error = %(error)s
    WHERE trigger_id = %(trigger_id)s
    RETURNING trigger_id, function, requested_by, reason, requested_at, outcome, job_name, error
), freed AS (
    UPDATE {schema}.function_trigger_slots s SET last_at = '-infinity'
    FROM t WHERE s.function = t.function AND s.last_at = t.requested_at
)
SELECT * FROM t;

-- recent --
-- The latest triggers, newest first (of one function, or of all).
SELECT trigger_id, function, requested_by, reason, requested_at, outcome, job_name, error
FROM {schema}.function_triggers
WHERE %(function)s::text IS NULL OR function = %(function)s
ORDER BY trigger_id DESC
LIMIT %(limit)s;
