"""Logins for an installation's group roles, so that the tests run each function as its
role (``jobfence.store.roles``) — as a deployment does with one Secret per role.

``<schema>_<kind>_login`` is a login member of ``<schema>_<kind>``, created once per server
by a login that may create roles (the tests' and the demo's server superuser). Only what
the role grants is inherited: the login itself owns nothing and is granted nothing.
"""

from __future__ import annotations

import contextlib

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobfence.store.roles import KINDS, ROLE_OF_COMMAND, role_names

BOOTSTRAP = ("migrate",)
"""Commands left on the given login: the first migrate of a database creates its schema,
which takes a login with CREATE on the database (a DBA's, here the server superuser)."""


def login_name(schema: str, kind: str) -> str:
    return f"{role_names(schema)[kind]}_login"


def ensure_logins(url: str, schema: str = "jobfence") -> dict[str, str]:
    """Create the logins of ``schema``'s roles that are missing (the roles must exist: run
    ``jobfence migrate`` first) and return each kind's URL: ``url`` with its user."""
    with psycopg.connect(url, autocommit=True) as admin:
        for kind in KINDS:
            login, group = login_name(schema, kind), role_names(schema)[kind]
            if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone():
                continue
            with contextlib.suppress(psycopg.errors.DuplicateObject):  # made just now
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                    sql.Identifier(login), sql.Identifier(group)))
    return {kind: as_login(url, login_name(schema, kind)) for kind in KINDS}


def as_login(url: str, login: str) -> str:
    """``url`` for another login (no password: the throwaway servers trust local logins)."""
    params = conninfo_to_dict(url)
    params.pop("password", None)
    return make_conninfo(**{**params, "user": login})  # type: ignore[arg-type]



def url_of(urls: dict[str, str], command: str, default: str) -> str:
    """The URL ``command`` connects with: its role's login from ``urls`` (as
    ``ensure_logins`` returns them), ``default`` for the bootstrap migrate or without
    logins."""
    if not urls or command in BOOTSTRAP or command not in ROLE_OF_COMMAND:
        return default
    return urls[ROLE_OF_COMMAND[command]]
