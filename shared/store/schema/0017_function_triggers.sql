-- 0017: manual triggers of the periodic functions (the console's and the API's), each
-- recorded with who asked, why, and what came of it; at most one per function per interval.
--
-- A trigger takes its function's slot first: one statement that moves last_at forward
-- only when the interval has passed since the previous trigger. Concurrent requests queue
-- on the slot's row lock and each re-reads it once the one before commits, so exactly one
-- wins whatever the number of replicas serving the console. A trigger the cluster refused
-- hands its slot back (last_at reset), so the next attempt need not wait.
CREATE TABLE function_trigger_slots (
    function text PRIMARY KEY,
    last_at  timestamptz NOT NULL
);

CREATE TABLE function_triggers (
    trigger_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    function     text NOT NULL,
    requested_by text NOT NULL,
    reason       text NOT NULL,
    requested_at timestamptz NOT NULL,
    outcome      text NOT NULL DEFAULT 'requested'
                 CHECK (outcome IN ('requested', 'created', 'failed')),
    job_name     text,
    error        text
);
CREATE INDEX function_triggers_function ON function_triggers (function, trigger_id);

-- The console's and `list`'s status filter on the jobs that need a look: failed and
-- cancelled jobs are few among the finished, so newest-first over the primary key would
-- read through every succeeded one to fill a page. Only those rows are indexed (a
-- succeeded job never enters it); building it reads the table once.
CREATE INDEX jobs_unsuccessful ON jobs (status, job_id) WHERE status IN ('failed', 'cancelled');
