"""``jobfence migrate`` never adopts a role it did not make for its schema: a role named
like one of the installation's group roles (``<schema>_operator``...) that already exists
and was not created by jobfence for this schema, or that may log in, is a superuser or may
create roles, is refused by name — exit 2, nothing written (no schema, no grant) — so a
login nobody meant to empower never gets jobfence's powers. Roles jobfence made (itself,
or a DBA running ``migrate --roles-sql``) are its own to migrate again."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from jobfence.store.roles import setup_sql
from tests.support import run_cli
from tests.support.pg import Databases


def state(url: str, schema: str) -> list[tuple[str, ...]]:
    """The schema (if any), the installation's roles and what they were granted."""
    with psycopg.connect(url) as conn:
        return [tuple(str(v) for v in r) for r in conn.execute("""
            SELECT 'schema', nspname, '' FROM pg_namespace WHERE nspname = %(s)s
            UNION ALL
            SELECT 'role', r.rolname, coalesce(shobj_description(r.oid, 'pg_authid'), '')
            FROM pg_roles r WHERE r.rolname LIKE %(s)s || '\\_%%'
            UNION ALL
            SELECT 'member', m.roleid::regrole::text, m.member::regrole::text
            FROM pg_auth_members m WHERE m.member::regrole::text LIKE %(s)s || '\\_%%'
               OR m.roleid::regrole::text LIKE %(s)s || '\\_%%'
            ORDER BY 1, 2, 3""", {"s": schema}).fetchall()]


@pytest.mark.parametrize(("kind", "attributes"), [
    ("operator", "LOGIN"), ("worker", "NOLOGIN SUPERUSER"), ("reader", "NOLOGIN CREATEROLE"),
    ("owner", "NOLOGIN")])
def test_migrate_refuses_a_role_it_did_not_make_and_writes_nothing(
        databases: Databases, kind: str, attributes: str) -> None:
    schema = f"adopt_{kind}"
    role = f"{schema}_{kind}"
    url = databases.create(migrated=False)
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("CREATE ROLE {} " + attributes).format(sql.Identifier(role)))
        before = state(url, schema)
        r = run_cli(url, "migrate", JOBFENCE_SCHEMA=schema)
        assert r.returncode == 2, r.stderr
        assert role in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert state(url, schema) == before
    finally:
        databases.drop(url)
        with psycopg.connect(databases.server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_roles_a_dba_made_with_the_roles_sql_are_migrated(databases: Databases) -> None:
    schema = "dba_made"
    url = databases.create(migrated=False)
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            login = admin.execute("SELECT current_user AS u, current_database() AS d"
                                  ).fetchone()
            assert login is not None
            for name in ("owner", "worker", "maintainer", "operator", "reader", "scaler"):
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(
                    sql.Identifier(f"{schema}_{name}")))
            admin.execute(setup_sql(schema, login[0], login[1]))
        r = run_cli(url, "migrate", JOBFENCE_SCHEMA=schema)
        assert r.returncode == 0, r.stderr
        assert run_cli(url, "migrate", JOBFENCE_SCHEMA=schema).returncode == 0
    finally:
        databases.drop(url)
