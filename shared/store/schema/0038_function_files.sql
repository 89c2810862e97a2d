-- 0038: every database function, trigger and view in one current file per noun.
--
-- From here on a migration keeps tables, columns, indexes, grants and data changes; the
-- live definition of each function, trigger and view is in `store/<noun>.functions.sql`,
-- and `jobfence migrate`, once the migrations are applied, re-creates each of those files
-- whose text changed since it last ran here (store/migrations.py), in one transaction,
-- under the same advisory lock as the migrations. This table is how it knows: one row per
-- file, the SHA-256 of the text it ran. Functions defined before this migration stay where
-- they were defined as well (an installed database has run them); the files define the
-- same ones, and re-creating them changes nothing.
--
-- Additive: a release before this one never reads the table.

CREATE TABLE {schema}.jobfence_function_files (
    file       text PRIMARY KEY,
    digest     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
