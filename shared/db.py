"""Database connections, the one place psycopg errors become jobfence errors, and the
advisory locks that make every periodic function safe to run twice at once.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from shared.errors import (
    ConfigError,
    Conflict,
    InvalidSpec,
    JobfenceError,
    NotMigrated,
    ResourceBusy,
    StoreError,
    StoreUnavailable,
)
from shared.queries import QUERIES

# All jobfence advisory locks share this first key, so they never collide with an
# application's own advisory locks in the same database.
LOCK_NAMESPACE = 0x6A66  # "jf"

Connection = psycopg.Connection[dict[str, Any]]


def connect(
    dsn: str,
    *,
    application_name: str = "jobfence",
    connect_timeout: float = 5.0,
    statement_timeout_ms: int | None = None,
) -> Connection:
    """An autocommit connection returning rows as dicts.

    TCP keepalives and a user timeout make a network partition surface as an error within
    seconds instead of hanging a worker past its lease.
    """
    options = f"-c statement_timeout={statement_timeout_ms}" if statement_timeout_ms else None
    try:
        return psycopg.connect(
            dsn,
            autocommit=True,
            row_factory=dict_row,
            application_name=application_name,
            connect_timeout=max(1, round(connect_timeout)),
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
            tcp_user_timeout=max(1000, int(connect_timeout * 1000)),
            options=options,
        )
    except psycopg.ProgrammingError as exc:  # a connection string psycopg cannot use
        raise ConfigError("JOBFENCE_DATABASE_URL is not a usable connection string: "
                          f"{_first_line(exc)}") from exc
    except psycopg.Error as exc:
        raise translate(exc) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def translate(exc: BaseException) -> BaseException:
    """Map a psycopg error to the jobfence error a caller can act on."""
    if isinstance(exc, JobfenceError):
        return exc
    if isinstance(exc, pg_errors.UniqueViolation):
        diag = exc.diag
        if diag.constraint_name == "jobs_resource_active":
            return ResourceBusy(_key_value(diag.message_detail))
        return Conflict(f"conflicting write: {diag.message_primary}")
    if isinstance(exc, pg_errors.UndefinedTable | pg_errors.UndefinedFunction
                  | pg_errors.UndefinedColumn | pg_errors.InvalidSchemaName):
        return NotMigrated("the database has no jobfence schema, or an older one than this "
                           f"release needs ({_first_line(exc)}): run `jobfence migrate`")
    if isinstance(exc, pg_errors.CheckViolation | psycopg.DataError):
        # A value the database cannot hold (a NUL, an out-of-range number or timestamp...).
        return InvalidSpec(f"rejected by the database: {_first_line(exc)}")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return StoreUnavailable(f"database unavailable: {_first_line(exc)}")
    if isinstance(exc, psycopg.Error):
        return StoreError(f"the database refused the operation: {_first_line(exc)}")
    return exc


def _key_value(detail: str | None) -> str | None:
    # "Key (resource)=(db.events) already exists."
    if not detail or "=(" not in detail:
        return None
    return detail.split("=(", 1)[1].rsplit(") already exists", 1)[0]


@contextmanager
def translated() -> Iterator[None]:
    """Re-raise psycopg errors inside the block as jobfence errors."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from exc


def lock_key(name: str) -> int:
    """A stable 32-bit advisory-lock key for a lock name (e.g. a function's name)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _lock_params(name: str) -> dict[str, int]:
    return {"namespace": LOCK_NAMESPACE, "key": lock_key(name)}


def try_advisory_lock(conn: Connection, name: str) -> bool:
    """Take the session-level lock ``name`` if free; False if another session holds it."""
    row = conn.execute(QUERIES["lock_try"], _lock_params(name)).fetchone()
    return bool(row and row["ok"])


def advisory_unlock(conn: Connection, name: str) -> None:
    conn.execute(QUERIES["lock_release"], _lock_params(name))


@contextmanager
def advisory_lock(conn: Connection, name: str) -> Iterator[None]:
    """Hold the session-level lock ``name`` for the block, waiting for it if needed."""
    conn.execute(QUERIES["lock_wait"], _lock_params(name))
    try:
        yield
    finally:
        if not conn.closed:
            advisory_unlock(conn, name)
