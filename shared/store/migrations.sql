-- Bookkeeping of the applied schema migrations.
-- Named statements, run by the method of the same name in store/migrations.py. {schema} is
-- the installation's schema (JOBFENCE_SCHEMA), filled in as a quoted identifier.

-- table_create --
-- Bookkeeping of applied migrations (created before anything else).
CREATE TABLE IF NOT EXISTS {schema}.jobfence_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- applied --
-- Versions already applied.
SELECT version, name, applied_at FROM {schema}.jobfence_schema_migrations ORDER BY version;

-- record --
-- Mark a migration applied (same transaction as the migration itself).
INSERT INTO {schema}.jobfence_schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- lock --
-- One migrating transaction at a time (held until this transaction ends: pooler-safe).
SELECT pg_advisory_xact_lock(%(namespace)s, %(key)s);

-- create_schema --
-- The installation's schema; every jobfence object lives in it.
CREATE SCHEMA IF NOT EXISTS {schema};

-- use_schema --
-- Unqualified names in a migration file mean the installation's schema, for this
-- transaction only; pg_temp last, so that a function created with `SET search_path FROM
-- CURRENT` never resolves a name in its caller's temporary schema first.
SELECT set_config('search_path', format('%%I, pg_temp', %(schema)s::text), true);

-- schema_exists --
-- Whether the installation's schema exists already.
SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = %(schema)s) AS found;

-- legacy_location --
-- Where a release from before JOBFENCE_SCHEMA kept its bookkeeping table: the first schema
-- of the connection's search path that has one.
SELECT n.nspname AS schema
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass('jobfence_schema_migrations');

-- function_digests --
-- The text each function file had when it was last run here (by its SHA-256).
SELECT file, digest FROM {schema}.jobfence_function_files;

-- record_function_file --
-- A function file was run (same transaction as the file itself).
INSERT INTO {schema}.jobfence_function_files AS f (file, digest)
VALUES (%(file)s, %(digest)s)
ON CONFLICT (file) DO UPDATE SET digest = excluded.digest, applied_at = now();

-- forget_function_files --
-- Files this release no longer ships (their functions are dropped by a migration).
DELETE FROM {schema}.jobfence_function_files WHERE NOT file = ANY(%(files)s::text[]);
