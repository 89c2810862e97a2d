"""The installation's group roles: one per kind of function, each able to do only what
that function does (invariant 9 in the contract).

==============  ===========================================================================
role            may
==============  ===========================================================================
owner           own the schema and every object in it; run ``jobfence migrate``
worker          run the worker's fenced verbs (``worker_*`` functions), nothing else: no
                table, no other job's fence
maintainer      the periodic functions: read everything, reclaim, time out, expire,
                finalize, settle, retain, fire schedules' due ticks (only the job an
                operator scheduled); write their own runs, leases and snapshots
operator        enqueue, cancel, retry (one job or a selection), wait, drain, queues,
                schedules; read everything
reader          read everything: status, list, KEDA's queries, metrics
scaler          KEDA's login: the pools' trigger query (the columns it reads), nothing else
==============  ===========================================================================

Roles live in the server, not in a database, so they are named after the schema
(``<schema>_worker``, ...). ``jobfence migrate`` creates those missing when its login may
(a superuser, or ``CREATEROLE``), takes ownership of the schema's objects for the owner
role when its login may act as it, and grants each role its privileges — again at every
migrate, so that objects of new migrations are covered. When the login may not create
roles, migrate says so and ``jobfence migrate --roles-sql`` prints the statements for a
DBA to run (they mark the roles too). Logins are the deployment's business:
``GRANT jobfence_worker TO app_worker``.

Migrate never adopts a role it did not make: each role it creates carries a mark (its
comment: ``mark``), and before anything is written a role of those names that exists
without this schema's mark — or that may log in, is a superuser, may create roles,
replicate or bypass row security, marked or not — is refused by name (exit 2): otherwise a
login nobody meant to empower (an application's ``<schema>_operator``) would get
jobfence's powers. Roles of an installation its owner role already owns, made by a release
that did not mark them yet, are marked and kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobfence import db
from jobfence.db import Composed, Connection
from jobfence.errors import ConfigError, JobfenceError

KINDS = ("owner", "worker", "maintainer", "operator", "reader", "scaler")

ROLE_OF_COMMAND = {
    "migrate": "owner",
    "worker": "worker",
    "sweeper": "maintainer", "reconciliation": "maintainer", "lifecycle": "maintainer",
    "export-finalize": "maintainer", "orphan-cleanup": "maintainer",
    "schedules": "maintainer",
    "enqueue": "operator", "cancel": "operator", "retry": "operator", "wait": "operator",
    "drain": "operator",
    "queue": "operator", "serve": "operator", "schedule": "operator", "workflow": "operator",
    "status": "reader", "list": "reader", "info": "reader", "metrics": "reader",
    "runs": "reader",
    "pools": "reader",
}
"""The role each command of the CLI runs as (``drain status`` and ``queue status`` need only
the reader's; the command's role covers its every subcommand)."""


def role_names(schema: str) -> dict[str, str]:
    """Each kind of role's name for an installation's schema."""
    return {kind: f"{schema}_{kind}" for kind in KINDS}


@dataclass(frozen=True, slots=True)
class RolesReport:
    created: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    """Roles that do not exist and this login may not create (then nothing is granted)."""
    owner: str | None = None
    """The role owning the schema's objects, when it is the owner role."""

    @property
    def granted(self) -> bool:
        return not self.missing


class Roles:
    """The role statements (``roles.sql``) for one schema."""

    def __init__(self, conn: Connection, schema: str) -> None:
        self.conn, self.schema = conn, schema
        self.names = role_names(schema)
        self.sql = db.queries("jobfence.store", "roles.sql", schema, **self.names)

    def may_create(self) -> bool:
        row = db.execute(self.conn, self.sql["may_create"]).fetchone()
        return bool(row and row["may"])

    def existing(self) -> set[str]:
        return {r["rolname"] for r in db.execute(
            self.conn, self.sql["existing"], {"names": list(self.names.values())})}

    def refuse_foreign(self) -> None:
        """ConfigError (exit 2, before anything is written) naming each role of this
        installation's names that jobfence did not make for this schema, or that has a
        power a group role must never have."""
        installed = db.execute(self.conn, self.sql["installed"], {
            "schema": self.schema, "owner": self.names["owner"]}).fetchone()
        legacy = bool(installed and installed["installed"])
        kinds = {name: kind for kind, name in self.names.items()}
        problems = []
        for r in db.execute(self.conn, self.sql["found"],
                            {"names": list(self.names.values())}).fetchall():
            powers = [power for power, column in POWERS if r[column]]
            name = r["rolname"]
            if powers:
                problems.append(f"{name} exists with {', '.join(powers)}")
            elif r["mark"] != mark(self.schema, kinds[name]) and not (
                    legacy and r["mark"] is None):
                problems.append(f"{name} exists and was not created by jobfence for schema "
                                f"{self.schema!r}")
        if problems:
            raise ConfigError(
                "migrate will not give jobfence's powers to a role it did not make: "
                + "; ".join(problems) + " (drop or rename the role, or choose another "
                "JOBFENCE_SCHEMA)")

    def mark_unmarked(self) -> None:
        """Mark the roles of an installation made before roles were marked (a login that
        may create roles only)."""
        kinds = {name: kind for kind, name in self.names.items()}
        for r in db.execute(self.conn, self.sql["found"],
                            {"names": list(self.names.values())}).fetchall():
            if r["mark"] is None:
                with db.transaction(self.conn):
                    db.execute(self.conn, mark_role(r["rolname"],
                                                    mark(self.schema, kinds[r["rolname"]])))

    def may_become_owner(self) -> bool:
        row = db.execute(self.conn, self.sql["may_become_owner"],
                         {"owner": self.names["owner"]}).fetchone()
        return bool(row and row["may"])

    def become_owner(self) -> None:
        """Act as the owner role until the transaction ends (objects created are its)."""
        db.execute(self.conn, self.sql["become_owner"])

    def not_owned(self) -> list[dict[str, str]]:
        rows: list[dict[str, str]] = db.execute(self.conn, self.sql["not_owned"], {
            "schema": self.schema, "owner": self.names["owner"]}).fetchall()
        return rows

    def grant(self) -> None:
        db.execute(self.conn, self.sql["grant"])

    # -- composite -------------------------------------------------------------------------

    def create_missing(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Create the roles that do not exist when this login may; (created, missing)."""
        missing = [name for name in self.names.values() if name not in self.existing()]
        if not self.may_create():
            return (), tuple(missing)
        self.mark_unmarked()
        kinds = {name: kind for kind, name in self.names.items()}
        for name in missing:
            try:
                with db.transaction(self.conn):
                    db.execute(self.conn, create_role(name))
                    db.execute(self.conn, mark_role(name, mark(self.schema, kinds[name])))
            except JobfenceError:
                if name not in self.existing():  # else another migrate made it just now
                    raise
        return tuple(missing), ()

    def take_ownership(self) -> None:
        """Give the owner role whatever of the schema it does not own yet."""
        owner = self.names["owner"]
        for obj in self.not_owned():
            if obj["kind"] == "schema":
                stmt = db.statement("ALTER SCHEMA {name} OWNER TO {owner}",
                                    name=obj["name"], owner=owner)
            elif obj["kind"] == "table":
                stmt = db.statement("ALTER TABLE {name} OWNER TO {owner}",
                                    name=(self.schema, obj["name"]), owner=owner)
            else:  # the argument list is the server's own rendering of the signature
                stmt = db.statement("ALTER FUNCTION {name}({args}) OWNER TO {owner}",
                                    name=(self.schema, obj["name"]), owner=owner,
                                    trusted={"args": obj["args"]})
            db.execute(self.conn, stmt)


def create_role(name: str) -> Composed:
    return db.statement("CREATE ROLE {name} NOLOGIN", name=name)


POWERS = (("LOGIN", "rolcanlogin"), ("SUPERUSER", "rolsuper"),
          ("CREATEROLE", "rolcreaterole"), ("REPLICATION", "rolreplication"),
          ("BYPASSRLS", "rolbypassrls"))
"""What a group role must never be able to do (a login is granted the group, never is it)."""


def mark(schema: str, kind: str) -> str:
    """The comment jobfence leaves on a group role it made for ``schema``."""
    return f"jobfence {kind} role of schema {schema}"


def mark_role(name: str, text: str) -> Composed:
    return db.statement("COMMENT ON ROLE {name} IS {text}", name=name,
                        trusted={"text": db.literal(text)})


def setup_sql(schema: str, login: str, database: str) -> str:
    """The statements a DBA runs when ``login`` (the login that runs ``jobfence migrate``)
    may not create roles: the group roles, the owner role granted to ``login``, and the
    owner's right to create the schema in ``database``."""
    names = role_names(schema)
    lines = [line for kind, name in names.items()
             for line in (create_role(name).as_string(None) + ";",
                          mark_role(name, mark(schema, kind)).as_string(None) + ";")]
    lines.append(db.statement("GRANT {owner} TO {login};", owner=names["owner"],
                              login=login).as_string(None))
    lines.append(db.statement("GRANT CREATE ON DATABASE {database} TO {owner};",
                              database=database, owner=names["owner"]).as_string(None))
    return "\n".join(lines) + "\n"


def connection_identity(conn: Connection) -> tuple[str, str]:
    """(login, database) of a connection."""
    row = db.execute(conn, "SELECT session_user AS login, current_database() AS db").fetchone()
    assert row is not None
    return str(row["login"]), str(row["db"])
