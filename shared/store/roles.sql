-- The installation's group roles and what each may do (run by store/roles.py at the end of
-- every `jobfence migrate`). {schema} is the installation's schema; {owner}, {worker},
-- {maintainer}, {operator}, {reader} and {scaler} are its group roles (<schema>_owner, ...), each
-- filled in as a quoted identifier. A deployment grants these roles to its login users.

-- may_create --
-- Whether this session may create roles.
SELECT rolsuper OR rolcreaterole AS may FROM pg_roles WHERE rolname = current_user;

-- existing --
-- Which of these roles exist already.
SELECT rolname FROM pg_roles WHERE rolname = ANY(%(names)s::text[]);

-- found --
-- The installation's roles that exist: the powers a group role must never have, and the
-- mark jobfence leaves on a role it made (its comment, roles.py's `mark`).
SELECT r.rolname, r.rolcanlogin, r.rolsuper, r.rolcreaterole, r.rolreplication,
       r.rolbypassrls, shobj_description(r.oid, 'pg_authid') AS mark
FROM pg_roles r WHERE r.rolname = ANY(%(names)s::text[]);

-- installed --
-- Whether the schema is an installation that its owner role already owns (migrated by a
-- release that made its roles without marking them).
SELECT EXISTS (
    SELECT FROM pg_namespace n JOIN pg_roles o ON o.oid = n.nspowner
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'jobfence_schema_migrations'
    WHERE n.nspname = %(schema)s AND o.rolname = %(owner)s) AS installed;

-- may_become_owner --
-- Whether this session may act as the owner role (a superuser, or a member of it).
SELECT pg_has_role(current_user, %(owner)s, 'MEMBER') AS may;

-- become_owner --
-- Create (and alter) as the owner role until this transaction ends.
SET LOCAL ROLE {owner};

-- not_owned --
-- Objects of the schema that the owner role does not own yet (an installation migrated
-- before the roles existed, or by another login): the schema itself, its tables and its
-- functions (indexes and identity sequences follow their tables).
SELECT 'schema' AS kind, n.nspname AS name, NULL AS args
FROM pg_namespace n
WHERE n.nspname = %(schema)s AND n.nspowner <> %(owner)s::regrole
UNION ALL
SELECT 'table', c.relname, NULL
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm')
  AND c.relowner <> %(owner)s::regrole
UNION ALL
SELECT 'function', p.proname, pg_get_function_identity_arguments(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = %(schema)s AND p.proowner <> %(owner)s::regrole;

-- grant --
-- Start from nothing (PUBLIC included: PostgreSQL lets everyone run a new function), then
-- give each role what its functions use. Trigger functions need no grant to fire.
REVOKE ALL ON SCHEMA {schema} FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA {schema}
    FROM PUBLIC, {worker}, {maintainer}, {operator}, {reader}, {scaler};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema}
    FROM PUBLIC, {worker}, {maintainer}, {operator}, {reader}, {scaler};
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {schema}
    FROM PUBLIC, {worker}, {maintainer}, {operator}, {reader}, {scaler};
GRANT USAGE ON SCHEMA {schema} TO {worker}, {maintainer}, {operator}, {reader}, {scaler};
GRANT EXECUTE ON FUNCTION {schema}.jobfence_identity()
    TO {worker}, {maintainer}, {operator}, {reader};
GRANT EXECUTE ON FUNCTION {schema}.jobfence_buckets(text) TO {maintainer}, {operator}, {reader};
GRANT EXECUTE ON FUNCTION {schema}.jobfence_workflow_state(uuid, timestamptz, integer)
    TO {maintainer}, {operator}, {reader};

-- worker: the fenced verbs, and settling what waited on its own terminal writes. No table.
GRANT EXECUTE ON FUNCTION
    {schema}.worker_claim(text, text, float8, integer),
    {schema}.worker_claim(text, text, float8, integer, uuid),
    {schema}.worker_release_claim(uuid, text, text),
    {schema}.worker_next_due(text),
    {schema}.worker_heartbeat(uuid, uuid, float8),
    {schema}.worker_record_action(uuid, uuid, integer, text, text, timestamptz, jsonb, text,
                                  text),
    {schema}.worker_finish(uuid, uuid, text, text, text, text, integer, text, text,
                           timestamptz, jsonb, text, text),
    {schema}.worker_release(uuid, uuid, float8, float8, text, text, text, integer, text, text,
                            timestamptz, jsonb, text, text),
    {schema}.worker_interrupt(uuid, uuid, text, integer),
    {schema}.worker_snooze(uuid, uuid, float8, text, integer),
    {schema}.worker_snooze(uuid, uuid, float8, text, integer, integer, text, text,
                           timestamptz, jsonb, text, text),
    {schema}.worker_register_outputs(uuid, uuid, jsonb),
    {schema}.worker_confirm_outputs(uuid, uuid, jsonb),
    {schema}.worker_fence(uuid, uuid),
    {schema}.worker_done_actions(uuid, uuid),
    {schema}.worker_holding(uuid[], uuid[]),
    {schema}.worker_stopped(uuid, uuid),
    {schema}.worker_heartbeat_many(uuid[], uuid[], float8),
    {schema}.worker_finish_many(jsonb),
    {schema}.worker_interrupt_many(uuid[], uuid[], text, integer),
    {schema}.settle_dependents(uuid[], integer),
    -- the parent of a child this attempt made terminal, finalized when it was the last
    {schema}.worker_parent_summary(uuid, uuid),
    {schema}.worker_parent_children(uuid, uuid, uuid, integer),
    {schema}.worker_parent_errors(uuid, uuid, integer),
    {schema}.worker_finalize_parent(uuid, uuid, text, text, text, text)
    TO {worker};
-- worker, when it traces: the trace context of the attempt it holds (worker_trace).
GRANT EXECUTE ON FUNCTION {schema}.worker_trace(uuid, uuid) TO {worker};
-- worker: registering a command's output streams before they go to S3 (worker_register_log).
GRANT EXECUTE ON FUNCTION {schema}.worker_register_log(uuid, uuid, integer) TO {worker};
-- worker, as it starts: the action names of its registry, labels of the action metrics.
GRANT EXECUTE ON FUNCTION {schema}.worker_register_actions(text[]) TO {worker};
-- worker: what its guards' ticks raised, counted (worker_guard_faults).
GRANT EXECUTE ON FUNCTION {schema}.worker_guard_faults(text, text[], bigint[]) TO {worker};

-- worker: the schema's version, which its refusal names when its release and the database
-- disagree (an older schema, or one a newer release's migrate moved on).
GRANT SELECT (version) ON {schema}.jobfence_schema_migrations TO {worker};

-- reader: status, list, queue status, drain status, KEDA's queries, metrics.
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {reader}, {maintainer}, {operator};

-- scaler: KEDA's login (the TriggerAuthentication's Secret). The pools' trigger query and
-- nothing else: the columns it reads, no job's actions, results, fence or audit trail.
GRANT SELECT (draining) ON {schema}.jobfence_control TO {scaler};
GRANT SELECT (name, paused, max_running, group_limit) ON {schema}.queues TO {scaler};
GRANT SELECT (status, queue, visible_at, is_parent, group_key) ON {schema}.jobs TO {scaler};

-- operator: enqueue (with `after`) inserts jobs born fresh (jobs_born_fresh); cancel,
-- retry, queues, drain and manual triggers only through their functions, each doing what
-- one command does and recording it; wait registers a watcher. The column grant on the
-- drain switch's constant `singleton` is what lets an enqueue take its share lock (FOR
-- SHARE needs an UPDATE grant); it changes nothing.
GRANT INSERT ON {schema}.jobs TO {operator};
GRANT INSERT ON {schema}.job_dependencies TO {operator};
GRANT INSERT, UPDATE, DELETE ON {schema}.job_watchers TO {operator};
GRANT UPDATE (singleton) ON {schema}.jobfence_control TO {operator};
GRANT EXECUTE ON FUNCTION {schema}.resolve_waiting(uuid[]),
    {schema}.settle_dependents(uuid[], integer),
    {schema}.operator_cancel(uuid, text),
    {schema}.operator_retry(uuid, text),
    {schema}.operator_configure_queue(text, boolean, boolean, integer, text, text),
    {schema}.operator_queue_rate(text, integer, float8, text),
    {schema}.operator_queue_groups(text, boolean, integer, boolean, text),
    {schema}.operator_workflow_add(uuid, text, text, text, integer, text),
    {schema}.operator_workflow_mark(uuid, boolean, text, text),
    {schema}.operator_set_drain(boolean, text, text),
    {schema}.operator_trigger_request(text, text, text, float8),
    {schema}.operator_trigger_outcome(bigint, text, text),
    {schema}.operator_retry_many(uuid[], text),
    {schema}.operator_cancel_many(uuid[], text),
    {schema}.operator_reveal_env(uuid, text, text),
    {schema}.operator_schedule_add(text, text, text, jsonb, jsonb, timestamptz, text),
    {schema}.operator_schedule_pause(text, boolean, timestamptz, text),
    {schema}.operator_schedule_delete(text, text) TO {operator};

-- maintainer: the periodic functions (sweeper, reconciliation, lifecycle, export-finalize,
-- orphan-cleanup, schedules): reclaim, time out, expire, finalize, settle, retain; their
-- own runs, leases, snapshots and suspects. Never an enqueue of its own making, never the
-- drain switch: the schedules pass enqueues only what an operator scheduled, through
-- scheduler_fire, once per tick already due.
GRANT UPDATE, DELETE ON {schema}.jobs, {schema}.job_outputs TO {maintainer};
GRANT DELETE ON {schema}.workflows TO {maintainer};
GRANT DELETE ON {schema}.job_events, {schema}.job_action_results,
    {schema}.job_dependencies, {schema}.job_watchers TO {maintainer};
GRANT DELETE ON {schema}.function_triggers, {schema}.control_events TO {maintainer};
GRANT INSERT, UPDATE, DELETE ON {schema}.function_runs, {schema}.function_totals,
    {schema}.function_status, {schema}.function_leases, {schema}.pod_snapshots,
    {schema}.orphan_pod_suspects TO {maintainer};
GRANT INSERT, UPDATE ON {schema}.job_metrics TO {maintainer};
-- Lifecycle records how late it enforced what came due, in the statement that enforces it.
GRANT INSERT, DELETE ON {schema}.job_metric_deltas TO {maintainer};
GRANT INSERT, UPDATE, DELETE ON {schema}.job_metric_history TO {maintainer};
-- Every pass folds the action metrics too, and forgets the names no worker registers any more.
GRANT INSERT, UPDATE, DELETE ON {schema}.action_metrics TO {maintainer};
GRANT DELETE ON {schema}.action_metric_deltas, {schema}.action_names TO {maintainer};
GRANT DELETE ON {schema}.schedule_ticks TO {maintainer};
GRANT EXECUTE ON FUNCTION {schema}.jobfence_reclaim(uuid[], text[], text[], float8, float8),
    {schema}.jobfence_reclaim(uuid[], text[], text[], float8, float8, boolean[]),
    {schema}.jobfence_release_stopped(integer),
    {schema}.jobfence_retry_delay(integer, float8, float8),
    {schema}.jobfence_bucket(text, float8),
    {schema}.jobfence_observation(text, text, float8),
    {schema}.resolve_waiting(uuid[]),
    {schema}.settle_dependents(uuid[], integer),
    {schema}.jobfence_parent_summary(uuid),
    {schema}.jobfence_children_page(uuid, uuid, integer),
    {schema}.jobfence_first_errors(uuid, integer),
    {schema}.jobfence_finalize_parent(uuid, text, text, text, text),
    {schema}.scheduler_fire(uuid[], timestamptz[], timestamptz[], timestamptz[], uuid[],
                            text[])
    TO {maintainer};
