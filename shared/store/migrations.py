"""Numbered schema migrations (``store/schema/NNNN_name.sql``), applied in order, in the
installation's schema.

Every migration runs in its own transaction together with its bookkeeping row, under a
transaction-scoped advisory lock (it holds through a transaction-pooling PgBouncer, and a
crash releases it): two pods running ``jobfence migrate`` at once apply each migration
exactly once and in order between them (whichever takes the lock first applies it; the
other finds it applied and goes on). Each migration's transaction has
the installation's schema then ``pg_temp`` as its search path. Migrations up to 0018 name
objects unqualified; from 0019 on (``QUALIFIED_FROM``) a migration is a template that names
every object ``{schema}.name`` (braces of its own doubled), as the named statements do, and
every function it creates pins ``search_path = {schema}, pg_temp`` (invariant 13).
Migrations must be additive: a rolling deploy runs old and new pods against the same schema.

Migrations keep tables, columns, indexes and data, and define no function, trigger or view
(those before 0038 did when they were shipped; what they defined is in the function files,
and an installation that ran them as shipped upgrades to the same catalog).
The live definition of every function, trigger and view is in ``store/<noun>.functions.sql``
(``FUNCTION_FILES``), a template like the migrations: once they are applied, each file whose
text changed since it last ran here is run again, all of them in one transaction under the
same lock, as the owner role, and its digest recorded (``jobfence_function_files``). A file
is idempotent (CREATE OR REPLACE; DROP ... IF EXISTS first where a signature changes), and
the roles' grants that end every migrate give the re-created functions their privileges.
A database that a newer release migrated further keeps that release's functions.

``JOBFENCE_SCHEMA`` never names a schema jobfence did not create: ``public``,
``information_schema`` and ``pg_*`` are refused by the settings, and an existing schema
without jobfence's bookkeeping table is refused here, before anything is written — taking it
over would hand its objects to the owner role and replace its privileges.

Once the installation's group roles exist (``jobfence.store.roles``), migrations run as the
owner role, which owns every object of the schema, and each migrate ends by granting every
role its privileges.

A database migrated by a release from before ``JOBFENCE_SCHEMA`` keeps its objects in the
first schema of its search path (usually ``public``); the first migrate of this release
moves every one of them into the installation's schema, jobs intact, and goes on from the
version it had reached.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import LiteralString

from jobfence import db
from jobfence.db import Connection, schemas
from jobfence.errors import ConfigError
from jobfence.store import Store
from jobfence.store.roles import Roles, RolesReport

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

QUALIFIED_FROM = 19
"""The first migration written as a template naming every object ``{schema}.name``."""

LEGACY_TABLES = (
    "jobfence_schema_migrations", "jobfence_control", "jobs", "job_dependencies",
    "job_events", "job_action_results", "job_outputs", "function_runs",
    "orphan_pod_suspects", "function_totals", "function_status",
)
LEGACY_FUNCTIONS: tuple[tuple[str, LiteralString], ...] = (
    ("jobfence_retry_delay", "integer, float8, float8"), ("jobfence_audit_insert", ""),
    ("jobfence_audit_update", ""), ("jobfence_reclaim", "uuid[], text[], text[], float8, float8"),
)
"""What releases before 0009 created, by name (functions with their argument types)."""


FUNCTION_FILES = (
    "control", "job_metrics", "jobs", "dependencies", "parents", "attempts", "queues",
    "triggers", "schedules", "maintenance", "traces", "action_metrics", "workflows",
)
"""The nouns whose ``<noun>.functions.sql`` defines their database functions, in the order
they run: a file may use what the files before it define (a SQL function's body is checked
as it is created)."""


@dataclass(frozen=True, slots=True)
class FunctionFile:
    """One noun's database functions, triggers and views (``<noun>.functions.sql``)."""

    name: str
    sql: LiteralString

    @property
    def digest(self) -> str:
        """What tells a changed file from the one last run (the template's SHA-256)."""
        return hashlib.sha256(self.sql.encode()).hexdigest()

    def rendered(self, schema: str) -> db.Composed:
        return db.statement(self.sql, schema=schema)


def function_files() -> list[FunctionFile]:
    """Every function file shipped with this version, in the order they run."""
    store = resources.files("jobfence.store")
    return [FunctionFile(f"{noun}.functions.sql",
                         store.joinpath(f"{noun}.functions.sql").read_text("utf-8"))
            for noun in FUNCTION_FILES]


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: LiteralString

    def rendered(self, schema: str) -> LiteralString | db.Composed:
        """The statements to run for ``schema``: a template from QUALIFIED_FROM on."""
        if self.version < QUALIFIED_FROM:
            return self.sql
        return db.statement(self.sql, schema=schema)


@dataclass(frozen=True, slots=True)
class MigrateReport:
    applied: tuple[str, ...]
    already: int
    relocated_from: str | None = None
    """The schema an earlier release's objects were moved from, if this run moved them."""
    installation: str | None = None
    """The installation's identity (filled in by the first migrate, then fixed)."""
    current: int = 0
    """The schema's version once this run is done (migrations another run applied at the
    same time included)."""
    roles: RolesReport = field(default_factory=RolesReport)
    """The group roles this run created, or could not create (then nothing was granted)."""
    functions: tuple[str, ...] = ()
    """The function files this run re-created (their text had changed)."""


def available() -> list[Migration]:
    """Every migration shipped with this version, in order."""
    found = []
    for entry in resources.files("jobfence.store.schema").iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m[1]), m[2], entry.read_text("utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, got {versions}")
    return found


class Migrations:
    """The bookkeeping statements (``migrations.sql``) for one schema."""

    def __init__(self, conn: Connection, schema: str) -> None:
        self.conn, self.schema = conn, schema
        self.sql = db.queries("jobfence.store", "migrations.sql", schema)

    def lock(self) -> None:
        db.execute(self.conn, self.sql["lock"], db.lock_params(f"{self.schema}:migrate"))

    def create_schema(self) -> None:
        db.execute(self.conn, self.sql["create_schema"])

    def use_schema(self) -> None:
        db.execute(self.conn, self.sql["use_schema"], {"schema": self.schema})

    def table_create(self) -> None:
        db.execute(self.conn, self.sql["table_create"])

    def applied(self) -> set[int]:
        return {r["version"] for r in db.execute(self.conn, self.sql["applied"])}

    def record(self, mig: Migration) -> None:
        db.execute(self.conn, self.sql["record"], {"version": mig.version, "name": mig.name})

    def schema_exists(self) -> bool:
        row = db.execute(self.conn, self.sql["schema_exists"], {"schema": self.schema}).fetchone()
        return bool(row and row["found"])

    def refuse_foreign_schema(self) -> None:
        """ConfigError (nothing written) when the schema exists but jobfence did not create
        it: an application's schema must never be taken over."""
        if self.schema_exists() and not schemas.relation_exists(
                self.conn, self.schema, "jobfence_schema_migrations"):
            raise ConfigError(
                f"JOBFENCE_SCHEMA is {self.schema!r}, a schema that exists and was not created "
                "by jobfence (it has no jobfence_schema_migrations table): migrate would take "
                "over its objects and privileges. Choose a schema of jobfence's own (the "
                "default is jobfence)")

    def legacy_location(self) -> str | None:
        """Where an earlier release keeps its objects, if not in this schema already."""
        row = db.execute(self.conn, self.sql["legacy_location"]).fetchone()
        return str(row["schema"]) if row and row["schema"] != self.schema else None

    def apply(self, mig: Migration, owner: Roles | None = None) -> bool:
        """Apply one migration in its own transaction unless it was (as the owner role when
        ``owner`` is given); whether it ran."""
        with db.transaction(self.conn):
            self.lock()
            if owner is not None:
                owner.become_owner()
            self.use_schema()
            if mig.version in self.applied():
                return False
            # Our own package file, never input; the schema is a checked identifier.
            db.execute(self.conn, mig.rendered(self.schema))
            self.record(mig)
        return True

    def function_digests(self) -> dict[str, str]:
        return {r["file"]: r["digest"]
                for r in db.execute(self.conn, self.sql["function_digests"])}

    def record_function_file(self, file: FunctionFile) -> None:
        db.execute(self.conn, self.sql["record_function_file"],
                   {"file": file.name, "digest": file.digest})

    def forget_function_files(self, files: list[FunctionFile]) -> None:
        db.execute(self.conn, self.sql["forget_function_files"],
                   {"files": [f.name for f in files]})

    def apply_functions(self, owner: Roles | None = None) -> tuple[str, ...]:
        """Run every function file whose text changed since it last ran here, all in one
        transaction (as the owner role when ``owner`` is given): the names of those run.
        Nothing when the schema has a migration this release does not ship: its functions
        are a newer release's, which this one's must not replace."""
        files = function_files()
        with db.transaction(self.conn):
            self.lock()
            if owner is not None:
                owner.become_owner()
            self.use_schema()
            if max(self.applied(), default=0) > len(available()):
                return ()
            known = self.function_digests()
            changed = [f for f in files if known.get(f.name) != f.digest]
            for file in changed:
                # Our own package file, never input; the schema is a checked identifier.
                db.execute(self.conn, file.rendered(self.schema))
                self.record_function_file(file)
            self.forget_function_files(files)
        return tuple(f.name for f in changed)


def migrate(conn: Connection, schema: str = "jobfence",
            installation: str | None = None) -> MigrateReport:
    """Apply every migration not applied yet, then fill in the installation's identity
    (``installation``, or a generated name) if it has none yet — a ConfigError if it has
    another. Safe to run repeatedly and concurrently."""
    m = Migrations(conn, schema)
    Roles(conn, schema).refuse_foreign()  # before anything is written
    with db.transaction(conn):
        m.lock()
        m.refuse_foreign_schema()
        relocated = None
        if not schemas.relation_exists(conn, schema, "jobfence_schema_migrations"):
            relocated = m.legacy_location()
            # Only when it may be missing: CREATE SCHEMA IF NOT EXISTS needs CREATE on the
            # database even when the schema is there, which the owner role's login (the
            # migrate Job's) need not have.
            m.create_schema()
        if relocated:
            schemas.move_objects(conn, source=relocated, target=schema, tables=LEGACY_TABLES,
                            functions=LEGACY_FUNCTIONS)
        m.use_schema()
        m.table_create()
        already = len(m.applied())
    roles = Roles(conn, schema)
    created, missing = roles.create_missing()
    owner = roles if not missing and roles.may_become_owner() else None
    if owner is not None:
        with db.transaction(conn):
            m.lock()
            owner.take_ownership()
    applied = tuple(f"{mig.version:04d}_{mig.name}" for mig in available()
                    if m.apply(mig, owner))
    functions = m.apply_functions(owner)
    if not missing:
        with db.transaction(conn):
            m.lock()
            roles.grant()
    store = Store(conn, schema)
    identity = store.control.claim_identity(installation)
    return MigrateReport(applied=applied, already=already, relocated_from=relocated,
                         installation=identity.installation,
                         current=store.control.schema_version(),
                         roles=RolesReport(created=created, missing=missing,
                                           owner=roles.names["owner"] if owner else None),
                         functions=functions)
