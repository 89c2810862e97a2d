"""jobfence inside an application: enqueue, read and cancel jobs on a psycopg 3 connection
the application owns, in its own transaction.

    with conn.transaction():
        conn.execute("INSERT INTO orders ...")
        [job] = jobfence.enqueue(conn, {"actions": [...], "resource": "db.orders"})

The job and the application's own rows commit together or not at all: no job is lost
when the application crashes after its commit, and no job runs for writes that were
rolled back. The verbs are the CLI's, with its rules and its answers:

- ``enqueue(conn, spec_or_specs)`` takes what ``jobfence enqueue --spec`` takes (a spec as
  a dict or a ``JobSpec``, or a list of them), validates all of it before anything is
  written, and returns the objects ``enqueue`` prints, in order;
- ``status(conn, job_id)`` returns the ``status -o json`` object;
- ``cancel(conn, job_id, reason=None)`` returns the ``cancel`` object.

Transactions: inside a transaction the application has open (``with conn.transaction():``,
or any statement on a connection that is not in autocommit mode), everything is written
in it, under a savepoint — a refusal (``ResourceBusy``, ``Drained``, ``InvalidSpec``...)
leaves the application's transaction usable, and nothing of the call is kept. Nothing is
visible to workers, KEDA or other sessions until the application commits; its rollback
leaves no job, no audit event, no dependency and no resource held. On an autocommit
connection outside a transaction each call is its own transaction, as in the CLI.

While the transaction is open, the jobs it enqueued hold their resources: a second
enqueue on the same resource, from any session, waits for it and then gets
``ResourceBusy`` (the database's unique index decides). Keep such transactions short.

A spec with S3 ``inputs`` is listed before anything is written (the transaction never
waits on S3); the caller's transaction then holds the parent and all its children, in
memory until written (about a kilobyte per child): for inputs of hundreds of thousands of
objects, enqueue from a Job with the CLI, which streams them.

The connection is left as it was found: its row factory, ``search_path``, autocommit and
prepare settings are not touched (every statement names the installation's schema:
``schema=`` or ``JOBFENCE_SCHEMA``, else ``jobfence``). Statements follow the connection's
own ``prepare_threshold`` — behind PgBouncer in transaction mode, set it to ``None`` as for
any other statement. Other settings (``JOBFENCE_MAX_ATTEMPTS``, the S3 settings for
``inputs``) come from the environment, as for the CLI; the database URL is not needed.

The connection's login needs the operator role (``<schema>_operator``) to enqueue and
cancel, the reader role to read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from jobfence import db
from jobfence.errors import ConfigError, InvalidSpec, JobNotFound
from jobfence.ids import parse_job_id
from jobfence.jsonable import to_jsonable
from jobfence.limits import schema_refusal
from jobfence.settings import Settings, load_settings
from jobfence.spec import JobSpec, parse_specs
from jobfence.store import Store
from jobfence.submit import cancelled_object, enqueued_object, submit
from jobfence.views import job_views
from jobfence.workflows import is_workflow, parse_workflow, submit_workflow, submitted_object

Spec = Mapping[str, Any] | JobSpec
"""One job spec: what ``jobfence enqueue --spec`` reads, as a mapping or a ``JobSpec``."""

__all__ = ["Spec", "cancel", "enqueue", "status"]


def enqueue(conn: Any, specs: Spec | Sequence[Spec], *,
            schema: str | None = None) -> list[dict[str, Any]]:
    """Enqueue one spec or a list of them in the connection's transaction (or in one of
    their own on an autocommit connection outside a transaction): all or nothing. One
    object per spec, in order: ``{"job_id", "status"}``, plus ``"children"`` for a spec
    with inputs and ``"created": false`` for an idempotent replay. A workflow (one object
    with ``workflow`` and ``steps``) is written whole: one object, its id and each step's."""
    plain = _plain(specs)
    if is_workflow(plain):
        workflow = parse_workflow(plain)
        store, settings = _open(conn, schema)
        done = submit_workflow(settings, store, workflow, actor=None)
        return [to_jsonable(submitted_object(done))]
    parsed = parse_specs(plain)  # every spec checked before any statement
    store, settings = _open(conn, schema)
    return [enqueued_object(job) for job in submit(settings, store, parsed, list_first=True)]


def status(conn: Any, job_id: UUID | str, *, schema: str | None = None,
           events: bool = False) -> dict[str, Any]:
    """The job as ``jobfence status -o json`` shows it (with ``events``: its audit trail,
    as ``--events`` adds it). ``JobNotFound`` when there is no such job."""
    job = _job_id(job_id)
    store, _ = _open(conn, schema)
    row = store.jobs.get(job)
    if row is None:
        raise JobNotFound(job)
    view = job_views(store, [row])[0]
    if events:
        view["events"] = store.jobs.events(job)
    result: dict[str, Any] = to_jsonable(view)
    return result


def cancel(conn: Any, job_id: UUID | str, reason: str | None = None, *,
           schema: str | None = None) -> dict[str, Any]:
    """Cancel a job (a parent's unfinished children with it), as ``jobfence cancel``: a
    running command is stopped within a second once this commits, and the job keeps its
    resource until its worker confirms the command gone. ``JobNotFound``,
    ``JobAlreadyTerminal``."""
    job = _job_id(job_id)
    if reason is not None and not isinstance(reason, str):
        raise InvalidSpec("reason must be text")
    store, _ = _open(conn, schema)
    done = store.jobs.cancel(job_id=job, reason=reason or "cancelled by application")
    return cancelled_object(job, done)


def _open(conn: Any, schema: str | None) -> tuple[Store, Settings]:
    if schema is not None and (why := schema_refusal(schema)) is not None:
        raise ConfigError(f"schema {why}")
    checked = db.callers(conn)
    settings = load_settings(database_url=db.conninfo(checked) or "dbname=jobfence",
                             schema_name=schema)
    return Store(checked, settings.schema_name), settings


def _plain(specs: Spec | Sequence[Spec]) -> object:
    """Specs as the parser reads them: a JobSpec back to its document."""
    def one(spec: object) -> object:
        if isinstance(spec, JobSpec):
            return spec.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return spec

    if isinstance(specs, Mapping | JobSpec):
        return one(specs)
    return [one(s) for s in specs] if isinstance(specs, Sequence) else specs


def _job_id(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return parse_job_id(value)
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None
