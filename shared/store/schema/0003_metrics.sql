-- 0003: what the metrics of the periodic functions are read from. Kept apart from the run
-- records (function_runs) so that their retention never resets a counter or forgets the
-- last success: one row per function and counted item, and one status row per function.
CREATE TABLE function_totals (
    function text NOT NULL,
    item     text NOT NULL,
    total    numeric NOT NULL DEFAULT 0,
    PRIMARY KEY (function, item)
);

CREATE TABLE function_status (
    function              text PRIMARY KEY,
    last_run_at           timestamptz NOT NULL,
    last_status           text NOT NULL,
    last_trigger          text NOT NULL,
    last_duration_seconds double precision,
    last_success_at       timestamptz
);
