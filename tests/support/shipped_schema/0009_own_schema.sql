-- 0009: every jobfence object in the installation's own schema (JOBFENCE_SCHEMA).
--
-- `jobfence migrate` creates the schema and runs each migration with it as the only schema
-- on the search path, so unqualified names here mean the installation's own objects; a
-- database migrated by an earlier release has its objects moved into the schema before
-- this migration (jobfence.store.migrations). The functions run with that schema fixed
-- (SET search_path FROM CURRENT, evaluated now), never with the caller's: an application
-- sharing the database can have its own `jobs` table, and its search path never changes
-- what a jobfence function reads or writes.
ALTER FUNCTION jobfence_retry_delay(integer, float8, float8) SET search_path FROM CURRENT;
ALTER FUNCTION jobfence_reclaim(uuid[], text[], text[], float8, float8)
    SET search_path FROM CURRENT;
ALTER FUNCTION jobfence_audit_insert() SET search_path FROM CURRENT;
ALTER FUNCTION jobfence_audit_update() SET search_path FROM CURRENT;
