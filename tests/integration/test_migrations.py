"""Migrations: a fresh migrate produces exactly the expected schema; running it again, or
from two processes at once, is harmless."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from devtools.sqlconn import connect
from jobfence.store.migrations import available, migrate
from tests.support import JOBFENCE, REPO, cli_env, run_cli
from tests.support.pg import Databases
from tests.support.schema_dump import dump
from tests.support.shipped import shipped_migrations

EXPECTED = Path(__file__).with_name("expected_schema.txt")


def test_fresh_migrate_gives_the_expected_schema(databases: Databases) -> None:
    url = databases.create(migrated=False)
    try:
        conn = connect(url)
        report = migrate(conn)
        conn.close()
        assert report.current == len(available())
        actual = dump(url)
        if os.environ.get("JOBFENCE_UPDATE_SCHEMA_SNAPSHOT"):
            EXPECTED.write_text(actual)
        assert actual == EXPECTED.read_text(), (
            "the migrations no longer produce expected_schema.txt; if the change is "
            "intended, run `make schema-snapshot` and review the diff")
    finally:
        databases.drop(url)


def test_migrate_twice_applies_nothing_the_second_time(databases: Databases) -> None:
    url = databases.create(migrated=False)
    try:
        conn = connect(url)
        first = migrate(conn)
        second = migrate(conn)
        conn.close()
        assert len(first.applied) == len(available())
        assert second.applied == () and second.current == first.current
    finally:
        databases.drop(url)


def test_migrate_from_two_processes_at_once(databases: Databases) -> None:
    url = databases.create(migrated=False)
    try:
        procs = [subprocess.Popen([*JOBFENCE, "migrate"], env=cli_env(url), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        # Each migration is applied once, by one of them (each takes the lock per
        # migration, so they may share the work), and the schema is the expected one.
        applied = [v for o, _ in outs for v in __import__("json").loads(o)["applied"]]
        assert sorted(applied) == [f"{m.version:04d}_{m.name}" for m in available()]
        assert dump(url) == EXPECTED.read_text()
    finally:
        databases.drop(url)


def public_objects(url: str) -> set[str]:
    """Every table, view, sequence, function and type in `public`."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("""
            SELECT c.relkind::text || ' ' || c.relname FROM pg_class c
            WHERE c.relnamespace = 'public'::regnamespace
            UNION ALL SELECT 'f ' || proname FROM pg_proc
            WHERE pronamespace = 'public'::regnamespace
            UNION ALL SELECT 't ' || typname FROM pg_type
            WHERE typnamespace = 'public'::regnamespace""").fetchall()
    return {r[0] for r in rows}


def test_migrate_beside_an_applications_own_jobs_table_leaves_it_alone(
        databases: Databases) -> None:
    """An application's database already has `public.jobs` and `public.job_events`:
    jobfence's migrate succeeds, every jobfence object is in its own schema, and the
    application's tables (and their rows) are untouched."""
    url = databases.create(migrated=False)
    try:
        with psycopg.connect(url, autocommit=True) as app:
            app.execute("CREATE TABLE jobs (id serial PRIMARY KEY, title text)")
            app.execute("CREATE TABLE job_events (id serial PRIMARY KEY, what text)")
            app.execute("INSERT INTO jobs (title) VALUES ('the application''s own')")
        before = public_objects(url)
        r = subprocess.run([*JOBFENCE, "migrate"], env=cli_env(url), cwd=REPO,
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        assert public_objects(url) == before
        assert dump(url) == EXPECTED.read_text()
        with psycopg.connect(url) as app:
            assert app.execute("SELECT title FROM public.jobs").fetchall() == [
                ("the application's own",)]
        r = run_cli(url, "enqueue", 'sleep:{"seconds": 0}')
        assert r.returncode == 0, r.stderr
        r = run_cli(url, "worker")
        assert r.returncode == 0, r.stderr
        assert public_objects(url) == before
    finally:
        databases.drop(url)


def test_two_schemas_in_one_database_are_two_installations(databases: Databases) -> None:
    url = databases.create(migrated=False)
    try:
        ids = {}
        for schema in ("jobfence", "tenant_b"):
            env = {"JOBFENCE_SCHEMA": schema}
            assert run_cli(url, "migrate", **env).returncode == 0
            r = run_cli(url, "enqueue", 'sleep:{"seconds": 0}', "--resource", "db.t", **env)
            assert r.returncode == 0, r.stderr  # the same resource, another installation
            ids[schema] = json.loads(r.stdout)["job_id"]
        assert dump(url, "tenant_b") == EXPECTED.read_text().replace("jobfence.", "tenant_b.")\
            .replace("search_path=jobfence", "search_path=tenant_b")
        r = run_cli(url, "worker", JOBFENCE_SCHEMA="tenant_b")
        assert json.loads(r.stdout)["jobs"] == [{"job_id": ids["tenant_b"],
                                                "outcome": "succeeded"}]
        for schema, expected in (("jobfence", "pending"), ("tenant_b", "succeeded")):
            r = run_cli(url, "status", ids[schema], "-o", "json", JOBFENCE_SCHEMA=schema)
            assert json.loads(r.stdout)["status"] == expected
        assert run_cli(url, "status", ids["jobfence"], JOBFENCE_SCHEMA="tenant_b"
                       ).returncode == 5
    finally:
        databases.drop(url)


def test_a_database_migrated_by_the_previous_release_moves_forward_intact(
        databases: Databases) -> None:
    """The previous release kept its objects in the first schema of the search path
    (`public`): they move into `jobfence` with every job, event and result, and the
    installation goes on from there."""
    url = databases.create(migrated=False)
    old = shipped_migrations()[:8]  # what the previous release shipped
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("""CREATE TABLE jobfence_schema_migrations (
                version integer PRIMARY KEY, name text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now())""")
            for m in old:
                with conn.transaction():
                    conn.execute(m.sql)
                    conn.execute("INSERT INTO jobfence_schema_migrations VALUES (%s, %s)",
                                 (m.version, m.name))
            conn.execute("""INSERT INTO jobs (job_id, status, actions, max_attempts)
                SELECT gen_random_uuid(), 'pending',
                       '[{"name": "sleep", "params": {"seconds": 0}}]', 3
                FROM generate_series(1, 5)""")
            done = conn.execute("""INSERT INTO jobs (job_id, status, actions, max_attempts,
                    attempt_count, finished_at) VALUES (gen_random_uuid(), 'succeeded',
                    '[]', 3, 1, now()) RETURNING job_id""").fetchone()
            assert done is not None
        old_events = 6
        r = run_cli(url, "migrate")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["moved_from_schema"] == "public"
        assert report["applied"] == [f"{m.version:04d}_{m.name}" for m in available()
                                     if m.version > 8]
        assert not {o for o in public_objects(url) if "job" in o}, public_objects(url)
        assert dump(url) == EXPECTED.read_text()
        with connect(url) as conn:
            assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone() == {"n": 6}
            assert conn.execute("SELECT count(*) AS n FROM job_events").fetchone() == {
                "n": old_events}
        r = run_cli(url, "worker", "--max-jobs", "10")
        assert r.returncode == 0 and json.loads(r.stdout)["succeeded"] == 5, r.stderr
        r = run_cli(url, "status", str(done[0]), "-o", "json")
        assert json.loads(r.stdout)["status"] == "succeeded"
        assert json.loads(run_cli(url, "migrate").stdout)["applied"] == []
    finally:
        databases.drop(url)


def schema_state(url: str, schema: str) -> list[tuple[str, ...]]:
    """Who owns ``schema`` and each of its objects, and their privileges."""
    with psycopg.connect(url) as conn:
        return [tuple(str(v) for v in r) for r in conn.execute("""
            SELECT 'schema', n.nspname, n.nspowner::regrole::text, coalesce(n.nspacl::text, '')
            FROM pg_namespace n WHERE n.nspname = %(s)s
            UNION ALL
            SELECT 'relation', c.relname, c.relowner::regrole::text, coalesce(c.relacl::text, '')
            FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM pg_namespace
                                                   WHERE nspname = %(s)s)
            UNION ALL
            SELECT 'role', rolname, '', '' FROM pg_roles WHERE rolname LIKE %(s)s || '\\_%%'
            ORDER BY 1, 2""", {"s": schema}).fetchall()]


def test_migrate_refuses_a_schema_postgresql_or_every_application_shares(
        databases: Databases) -> None:
    url = databases.create(migrated=False)
    try:
        for schema in ("public", "information_schema", "pg_catalog", "pg_jobs"):
            before = schema_state(url, schema)
            r = run_cli(url, "migrate", JOBFENCE_SCHEMA=schema)
            assert r.returncode == 2, (schema, r.stderr)
            assert f"'{schema}'" in r.stderr and "a schema of its own" in r.stderr, r.stderr
            assert schema_state(url, schema) == before
    finally:
        databases.drop(url)


def test_migrate_refuses_an_existing_schema_it_did_not_create_and_writes_nothing(
        databases: Databases) -> None:
    """An application's own schema named in JOBFENCE_SCHEMA by mistake: its objects keep
    their owner and privileges, and the application keeps using them."""
    url = databases.create(migrated=False)
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("DROP ROLE IF EXISTS shop_app")
            admin.execute("CREATE ROLE shop_app LOGIN")
            admin.execute("CREATE SCHEMA shop AUTHORIZATION shop_app")
            admin.execute("SET ROLE shop_app")
            admin.execute("CREATE TABLE shop.orders (id int PRIMARY KEY)")
            admin.execute("INSERT INTO shop.orders VALUES (1)")
        before = schema_state(url, "shop")
        r = run_cli(url, "migrate", JOBFENCE_SCHEMA="shop")
        assert r.returncode == 2, r.stderr
        assert "'shop'" in r.stderr and "was not created by jobfence" in r.stderr, r.stderr
        assert schema_state(url, "shop") == before
        from devtools.roles import as_login

        with psycopg.connect(as_login(url, "shop_app")) as app:
            assert app.execute("SELECT id FROM shop.orders").fetchall() == [(1,)]
        # A schema jobfence created is its own to migrate again.
        assert run_cli(url, "migrate", JOBFENCE_SCHEMA="shop_jobs").returncode == 0
        assert run_cli(url, "migrate", JOBFENCE_SCHEMA="shop_jobs").returncode == 0
    finally:
        databases.drop(url)


@pytest.mark.parametrize("schema_is", ["newer", "older"])
def test_a_worker_refused_by_a_schema_of_another_release_names_both_versions(
        databases: Databases, schema_is: str) -> None:
    """A worker whose claim the database no longer (or not yet) has says which migration the
    database is at and which this release knows — in a rolling deploy, an old pod meeting
    a newer release's schema is told so, not told to run migrate — and claims nothing."""
    url = databases.create()
    knows = len(available())
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            if schema_is == "newer":
                conn.execute("INSERT INTO jobfence.jobfence_schema_migrations "
                             "VALUES (%s, 'newer')", (knows + 1,))
            else:
                conn.execute("DELETE FROM jobfence.jobfence_schema_migrations "
                             "WHERE version = %s", (knows,))
            conn.execute("DROP FUNCTION jobfence.worker_claim(text, text, float8, integer, "
                         "uuid) CASCADE")
        enqueued = run_cli(url, "enqueue", 'sleep:{"seconds": 0}')
        assert enqueued.returncode == 0, enqueued.stderr
        r = run_cli(url, "worker")
        assert r.returncode == 2, r.stderr
        said = r.stderr.strip().splitlines()[-1]
        if schema_is == "newer":
            assert (f"migrated by a newer release (to migration {knows + 1:04d}; this "
                    f"release knows up to {knows:04d})") in said, said
            assert "run `jobfence migrate`" not in said, said
        else:
            assert (f"the database is at migration {knows - 1:04d} and this release needs "
                    f"{knows:04d}") in said, said
            assert said.endswith("run `jobfence migrate`"), said
        assert "worker_claim" in said, said
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT status FROM jobfence.jobs").fetchall() == [("pending",)]
    finally:
        databases.drop(url)
