-- Drain mode: the installation-wide switch that refuses enqueues and claims.
-- Named statements, run by the method of the same name in store/control.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- drain_status --
-- Whether drain mode is on, and since when.
SELECT draining, drain_changed_at, drain_reason FROM {schema}.jobfence_control;

-- drain_lock --
-- Enqueue takes this share lock so that `drain on` waits for enqueues already under way.
SELECT draining FROM {schema}.jobfence_control FOR SHARE;

-- set_drain --
-- Switch drain mode on or off, recorded with who did it: operator_set_drain.
SELECT * FROM {schema}.operator_set_drain(%(draining)s::boolean, %(reason)s::text,
                                          %(actor)s::text);

-- running_count --
-- Live claims (drain status: how many jobs still run).
SELECT count(*) AS n FROM {schema}.jobs WHERE status = 'running' AND NOT is_parent;

-- identity --
-- The installation's identity (NULL until `jobfence migrate` fills it in), and since when:
-- through a function every role may run (a worker's role reads no table).
SELECT installation, identified_at FROM {schema}.jobfence_identity();

-- claim_identity --
-- Fill in the identity once; afterwards it never changes (the row says which it is).
UPDATE {schema}.jobfence_control
SET installation = coalesce(installation, %(installation)s),
    identified_at = coalesce(identified_at, now())
RETURNING installation, identified_at;

-- schema_version --
-- The newest migration applied to this schema.
SELECT max(version) AS version FROM {schema}.jobfence_schema_migrations;

-- connections --
-- The server's client connections in use (every database's, every user's: what counts
-- against max_connections) and how many a non-superuser may open. A role without
-- pg_read_all_stats (the reader, the maintainer) sees the backend type of its own user's
-- sessions only; another user's session counts when it has a user and a database, which
-- every client connection has and the server's own processes (autovacuum included) have
-- not — a parallel query's worker, short-lived, is counted with them.
SELECT (SELECT count(*) FROM pg_stat_activity
        WHERE coalesce(backend_type = 'client backend',
                       usesysid IS NOT NULL AND datid IS NOT NULL)) AS in_use,
       current_setting('max_connections')::int
           - current_setting('superuser_reserved_connections')::int AS available;

-- durability --
-- How this server keeps an acknowledged commit (the promise across a failover needs a
-- synchronous standby that must acknowledge each commit): its synchronous_commit, its
-- synchronous standbys' names, and how many replicas stream from it.
SELECT current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS synchronous_standby_names,
       (SELECT count(*) FROM pg_stat_replication) AS replicas,
       pg_is_in_recovery() AS in_recovery;
