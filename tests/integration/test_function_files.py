"""The function files (store/<noun>.functions.sql) against the catalog: an installation
upgraded from any earlier release's head has exactly the catalog of a fresh install
(functions' bodies and settings, tables, indexes, triggers, grants, policies, ownership);
the files alone define every function and trigger; migrate re-creates a file only when its
text changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import psycopg
import pytest

from devtools.sqlconn import connect
from jobfence import db
from jobfence.store import migrations
from jobfence.store.migrations import Migrations, available, function_files, migrate
from tests.support.pg import Databases
from tests.support.schema_dump import catalog, first_difference
from tests.support.shipped import shipped_migrations

SCHEMA = "jobfence"
PUBLIC_UNTIL = 8
"""Releases up to this migration kept their objects in the first schema of the search path
(`public`); from 0009 on in the installation's schema."""


@pytest.fixture(scope="module")
def fresh(databases: Databases) -> list[str]:
    """The catalog of a fresh install by today's migrate."""
    url = databases.create(migrated=False)
    try:
        with connect(url) as conn:
            migrate(conn)
        return catalog(url)
    finally:
        databases.drop(url)


@pytest.fixture
def url(databases: Databases) -> Iterator[str]:
    url = databases.create(migrated=False)
    yield url
    databases.drop(url)


def install_head(url: str, head: int) -> None:
    """The database as the release whose newest migration was ``head`` left it: up to 0008
    in `public`, from 0009 on in the installation's schema; each migration as it was
    shipped, functions and all."""
    if head <= PUBLIC_UNTIL:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("""CREATE TABLE jobfence_schema_migrations (
                version integer PRIMARY KEY, name text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now())""")
            for mig in shipped_migrations()[:head]:
                with conn.transaction():
                    conn.execute(mig.sql)
                    conn.execute("INSERT INTO jobfence_schema_migrations VALUES (%s, %s)",
                                 (mig.version, mig.name))
        return
    with connect(url) as conn:
        m = Migrations(conn, SCHEMA)
        with db.transaction(conn):
            m.lock()
            m.create_schema()
            m.use_schema()
            m.table_create()
        for mig in shipped_migrations()[:head]:
            assert m.apply(mig)


def record_ddl(url: str) -> None:
    """Log every function or trigger any role creates in this database from now on (an
    event trigger: CREATE OR REPLACE of an unchanged function is logged too)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.ddl_log (tag text, identity text)")
        conn.execute("""CREATE FUNCTION public.log_ddl() RETURNS event_trigger
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
            BEGIN
                INSERT INTO public.ddl_log SELECT command_tag, object_identity
                FROM pg_event_trigger_ddl_commands()
                WHERE command_tag IN ('CREATE FUNCTION', 'CREATE TRIGGER');
            END $$""")
        conn.execute("CREATE EVENT TRIGGER log_ddl ON ddl_command_end "
                     "EXECUTE FUNCTION public.log_ddl()")


def ddl_logged(url: str) -> list[tuple[str, str]]:
    """What was logged since the last call (and forget it)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return sorted(conn.execute("DELETE FROM public.ddl_log RETURNING tag, identity"
                                   ).fetchall())


@pytest.mark.parametrize("head", range(1, len(available())),
                         ids=lambda h: f"from_{h:04d}")
def test_an_upgrade_from_an_earlier_head_gives_the_catalog_of_a_fresh_install(
        url: str, fresh: list[str], head: int) -> None:
    install_head(url, head)
    with connect(url) as conn:
        report = migrate(conn)
    assert report.current == len(available())
    assert report.functions == tuple(f.name for f in function_files())
    upgraded = catalog(url)
    assert upgraded == fresh, (
        f"upgraded from {head:04d}, the catalog is not a fresh install's; first "
        f"difference:\n{first_difference(fresh, upgraded)}")


def test_the_files_alone_define_every_function_and_trigger(
        url: str, fresh: list[str]) -> None:
    """Every function (and with them every trigger) dropped, the files put back exactly
    what a fresh install has: no function lives in a migration only."""
    with connect(url) as conn:
        migrate(conn)
    with psycopg.connect(url, autocommit=True) as conn:
        dropped = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace",
            (SCHEMA,)).fetchone()
        conn.execute("""DO $$ DECLARE f regprocedure; BEGIN
            FOR f IN SELECT oid::regprocedure FROM pg_proc
                     WHERE pronamespace = 'jobfence'::regnamespace LOOP
                EXECUTE format('DROP FUNCTION %s CASCADE', f);
            END LOOP; END $$""")
        conn.execute("DELETE FROM jobfence.jobfence_function_files")
        assert dropped is not None and dropped[0] >= 60
        assert conn.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = "
                            "%s::regnamespace", (SCHEMA,)).fetchone() == (0,)
    with connect(url) as conn:
        report = migrate(conn)
    assert report.applied == () and len(report.functions) == len(function_files())
    rebuilt = catalog(url)
    assert rebuilt == fresh, first_difference(fresh, rebuilt)


def test_migrate_again_recreates_no_function_and_a_changed_file_only_its_own(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with connect(url) as conn:
        first = migrate(conn)
    assert len(first.functions) == len(function_files())
    record_ddl(url)
    with connect(url) as conn:
        second = migrate(conn)
    assert second.applied == () and second.functions == ()
    assert ddl_logged(url) == []

    files = function_files()
    traces = next(f for f in files if f.name == "traces.functions.sql")
    changed = dataclasses.replace(traces, sql=traces.sql.replace(
        "SELECT j.traceparent,", "SELECT j.traceparent, -- changed\n          "))
    assert changed.sql != traces.sql
    monkeypatch.setattr(migrations, "function_files",
                        lambda: [changed if f is traces else f for f in files])
    with connect(url) as conn:
        third = migrate(conn)
    assert third.applied == () and third.functions == ("traces.functions.sql",)
    assert ddl_logged(url) == [
        ("CREATE FUNCTION", f"{SCHEMA}.worker_trace(pg_catalog.uuid,pg_catalog.uuid)")]
    with psycopg.connect(url) as conn:
        body = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'worker_trace'"
                            ).fetchone()
    assert body is not None and "-- changed" in body[0]
    with connect(url) as conn:
        assert migrate(conn).functions == ()
    assert ddl_logged(url) == []


def test_a_database_a_newer_release_migrated_keeps_that_releases_functions(
        url: str) -> None:
    """An older release's migrate (a rollback, a retried Job) never puts its own bodies
    over those of a release whose migrations it does not know."""
    with connect(url) as conn:
        migrate(conn)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobfence.jobfence_schema_migrations VALUES (%s, 'newer')",
                     (len(available()) + 1,))
        conn.execute("UPDATE jobfence.jobfence_function_files SET digest = 'newer'")
    record_ddl(url)
    with connect(url) as conn:
        report = migrate(conn)
    assert report.applied == () and report.functions == ()
    assert ddl_logged(url) == []
