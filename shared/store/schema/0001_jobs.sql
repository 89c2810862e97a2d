-- 0001: the fenced job store.
--
-- Invariants enforced here rather than in application code:
--   * a running job (other than a parent) always carries its fence, a waiting or pending one
--     never does (jobs_fence_matches_status);
--   * attempt_count never exceeds max_attempts (jobs_attempts_bounded);
--   * at most one active job per resource (jobs_resource_active, a partial unique index);
--   * every state transition appends an audit event in the same statement (the two
--     jobs_audit_* triggers), so no code path can transition without an event.
-- Migrations after this one must be additive: old and new pods run side by side.
--
-- Its functions, triggers and views are no longer defined here: their live definitions are
-- in store/<noun>.functions.sql, which every migrate runs after the migrations (0038 on);
-- as this migration first wrote them, they are in the repository's history.

CREATE TABLE jobfence_control (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    draining         boolean NOT NULL DEFAULT false,
    drain_changed_at timestamptz NOT NULL DEFAULT now(),
    drain_reason     text
);
INSERT INTO jobfence_control DEFAULT VALUES;

CREATE TABLE jobs (
    job_id          uuid PRIMARY KEY,
    status          text NOT NULL
        CONSTRAINT jobs_status_known
        CHECK (status IN ('waiting', 'pending', 'running', 'succeeded', 'failed', 'cancelled')),
    actions         jsonb NOT NULL CHECK (jsonb_typeof(actions) = 'array'),
    resource        text,
    priority        integer NOT NULL DEFAULT 0,
    max_attempts    integer NOT NULL CHECK (max_attempts >= 1),
    attempt_count   integer NOT NULL DEFAULT 0,
    -- pending: not claimable before this; running: the lease deadline.
    visible_at      timestamptz NOT NULL DEFAULT now(),
    -- The fence: fresh per claim, NULL while waiting/pending; kept on a terminal row when the
    -- holder of that attempt wrote the terminal state (so its outputs are the committed ones).
    attempt_id      uuid,
    claimed_by      text,
    claimed_at      timestamptz,
    heartbeat_at    timestamptz,
    run_deadline_at timestamptz,
    parent_id       uuid REFERENCES jobs (job_id) ON DELETE CASCADE,
    is_parent       boolean NOT NULL DEFAULT false,
    inputs          jsonb,
    labels          jsonb NOT NULL DEFAULT '{}'::jsonb,
    ttl             interval,
    timeout         interval,
    expires_at      timestamptz,
    idempotency_key text,
    spec_hash       text,
    -- why the job is in its current state; copied into the audit event of the transition.
    reason          text,
    error           text,
    error_detail    text,
    manifest        text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    retain_until    timestamptz,
    CONSTRAINT jobs_attempts_bounded CHECK (attempt_count >= 0 AND attempt_count <= max_attempts),
    CONSTRAINT jobs_fence_matches_status CHECK (
        CASE
            WHEN status IN ('waiting', 'pending') THEN attempt_id IS NULL
            WHEN status = 'running' AND NOT is_parent THEN attempt_id IS NOT NULL
            ELSE true
        END),
    CONSTRAINT jobs_terminal_has_finish CHECK (
        status NOT IN ('succeeded', 'failed', 'cancelled') OR finished_at IS NOT NULL),
    CONSTRAINT jobs_parent_flat CHECK (NOT (is_parent AND parent_id IS NOT NULL))
);

-- The ready queue: the claim walks this index in priority order.
CREATE INDEX jobs_ready ON jobs (priority DESC, visible_at) WHERE status = 'pending';
-- Live claims by lease deadline: sweeper, KEDA count, drain status.
CREATE INDEX jobs_running_lease ON jobs (visible_at) WHERE status = 'running' AND NOT is_parent;
-- Live claims by claimer: reconciliation against the cluster's pods.
CREATE INDEX jobs_running_claimer ON jobs (claimed_by) WHERE status = 'running' AND NOT is_parent;
-- Run timeouts.
CREATE INDEX jobs_run_deadline ON jobs (run_deadline_at)
    WHERE status = 'running' AND run_deadline_at IS NOT NULL;
-- Pending expiry.
CREATE INDEX jobs_pending_expiry ON jobs (expires_at)
    WHERE status IN ('waiting', 'pending') AND expires_at IS NOT NULL;
-- Dependencies still to resolve (a waiting parent's children wait on the parent instead).
CREATE INDEX jobs_waiting ON jobs (job_id) WHERE status = 'waiting' AND parent_id IS NULL;
-- Parents still to finalize.
CREATE INDEX jobs_running_parents ON jobs (job_id) WHERE is_parent AND status = 'running';
-- Children of a parent in id order (manifest pages, progress counts) ...
CREATE INDEX jobs_children ON jobs (parent_id, job_id) WHERE parent_id IS NOT NULL;
-- ... and the ones still active: "is any child left?" on every child's terminal write.
CREATE INDEX jobs_active_children ON jobs (parent_id)
    WHERE parent_id IS NOT NULL AND status IN ('waiting', 'pending', 'running');
-- Retention of top-level terminal jobs: with a ttl (retain_until) and without (finished_at).
CREATE INDEX jobs_retention_ttl ON jobs (retain_until)
    WHERE parent_id IS NULL AND retain_until IS NOT NULL;
CREATE INDEX jobs_retention_default ON jobs (finished_at)
    WHERE parent_id IS NULL AND ttl IS NULL AND finished_at IS NOT NULL;
-- ADR-015: exclusivity is the database's job, not the application's.
CREATE UNIQUE INDEX jobs_resource_active ON jobs (resource)
    WHERE resource IS NOT NULL AND status IN ('waiting', 'pending', 'running');
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- `after` dependencies. No foreign key on depends_on: a dependency that is gone is a reason
-- to fail the dependent, not a reason to block retention.
CREATE TABLE job_dependencies (
    job_id     uuid NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    depends_on uuid NOT NULL,
    PRIMARY KEY (job_id, depends_on)
);
CREATE INDEX job_dependencies_on ON job_dependencies (depends_on);

-- Append-only audit of transitions. No foreign key: the trail is kept on its own retention
-- and outlives the rows it describes.
CREATE TABLE job_events (
    event_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid NOT NULL,
    from_status text,
    to_status   text NOT NULL,
    attempt_id  uuid,
    reason      text,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX job_events_job ON job_events (job_id, event_id);
CREATE INDEX job_events_at ON job_events (at);

-- Per-attempt action results: a retry resumes after the last action that succeeded.
CREATE TABLE job_action_results (
    job_id       uuid NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    attempt_id   uuid NOT NULL,
    action_index integer NOT NULL,
    name         text NOT NULL,
    status       text NOT NULL CHECK (status IN ('succeeded', 'failed')),
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    result       jsonb,
    error        text,
    error_detail text,
    PRIMARY KEY (job_id, attempt_id, action_index)
);

-- Output files, registered before upload and confirmed after, per attempt.
CREATE TABLE job_outputs (
    job_id     uuid NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    attempt_id uuid NOT NULL,
    path       text NOT NULL,
    url        text NOT NULL,
    status     text NOT NULL CHECK (status IN ('running', 'done', 'error')),
    size_bytes bigint,
    error      text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, attempt_id, path)
);

-- One row per run of a periodic function (or an operator-triggered one).
CREATE TABLE function_runs (
    run_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    function    text NOT NULL,
    trigger     text NOT NULL DEFAULT 'scheduled' CHECK (trigger IN ('scheduled', 'manual')),
    status      text NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'skipped')),
    host        text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    counts      jsonb NOT NULL DEFAULT '{}'::jsonb,
    error       text
);
CREATE INDEX function_runs_function ON function_runs (function, started_at DESC);
CREATE INDEX function_runs_started ON function_runs (started_at);
