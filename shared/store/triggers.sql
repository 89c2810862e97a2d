-- request --
-- Take the function's slot when `interval` seconds have passed since its last trigger, and
-- record the request (who, why) in the same statement; no row when the slot is taken
-- (operator_trigger_request).
SELECT * FROM {schema}.operator_trigger_request(%(function)s::text, %(requested_by)s::text,
                                                %(reason)s::text, %(interval)s::float8);

-- next_allowed --
-- When the function's slot frees up (null when it is free now).
SELECT last_at + make_interval(secs => %(interval)s) AS at
FROM {schema}.function_trigger_slots
WHERE function = %(function)s AND last_at + make_interval(secs => %(interval)s) > clock_timestamp();

-- created --
-- The cluster created the trigger's Job (operator_trigger_outcome).
SELECT * FROM {schema}.operator_trigger_outcome(%(trigger_id)s::bigint, %(job_name)s::text,
                                                NULL::text);

-- failed --
-- The cluster refused the trigger: record why and hand the slot back
-- (operator_trigger_outcome).
SELECT * FROM {schema}.operator_trigger_outcome(%(trigger_id)s::bigint, NULL::text,
                                                %(error)s::text);

-- recent --
-- The latest triggers, newest first (of one function, or of all).
SELECT trigger_id, function, requested_by, reason, requested_at, outcome, job_name, error
FROM {schema}.function_triggers
WHERE %(function)s::text IS NULL OR function = %(function)s
ORDER BY trigger_id DESC
LIMIT %(limit)s;
