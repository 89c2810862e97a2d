"""The database module: the one place that imports psycopg. Connections and the one helper
that runs a statement — every psycopg error becomes a jobfence error there, and nowhere else;
named SQL rendered for the installation's schema (``jobfence.db.named``: ``.sql`` files
beside the code that runs them, ``{schema}`` filled in once as a quoted identifier, never
from input); staying on the writer across a failover (``jobfence.db.writer``).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import class_row, dict_row

from jobfence.db.named import Queries, literal, literal_fill, queries, statement
from jobfence.db.writer import (
    check_replicated,
    mark_stale,
    no_writer,
    replacing,
    stale,
    watch,
    writer_params,
)
from jobfence.errors import (
    ConfigError,
    Conflict,
    Drained,
    InvalidSpec,
    JobAlreadyTerminal,
    JobfenceError,
    JobNotFound,
    NotMigrated,
    NotRetryable,
    NotWriter,
    ResourceBusy,
    StoreError,
    StoreUnavailable,
)

__all__ = ["Queries", "literal", "literal_fill", "queries", "stale", "statement", "watch",
           "writer_params"]

# All jobfence advisory locks share this first key, so they never collide with an
# application's own advisory locks in the same database.
LOCK_NAMESPACE = 0x6A66  # "jf"

Connection = psycopg.Connection[dict[str, Any]]
Cursor = psycopg.Cursor[Any]
Composed = sql.Composed
T = TypeVar("T")

# -- connections ---------------------------------------------------------------------------


def check_dsn(dsn: str) -> None:
    """Raise ValueError if psycopg cannot parse ``dsn`` (the message never repeats it: it may
    hold a password)."""
    try:
        conninfo_to_dict(dsn)
    except Exception:
        raise ValueError("is not a valid PostgreSQL connection string (a URL "
                         "postgresql://USER@HOST/DB or key=value pairs)") from None


def connect(
    dsn: str,
    *,
    pooler: str = "none",
    application_name: str = "jobfence",
    connect_timeout: float = 5.0,
) -> Connection:
    """An autocommit connection returning rows as dicts.

    TCP keepalives and a user timeout make a network partition surface as an error within
    seconds instead of hanging a worker past its lease. Behind a transaction pooler
    (``pooler="transaction"``) nothing is prepared on the server: the next transaction may
    run on another server connection, where the statement does not exist. Nothing is set
    at start-up either (a pooler refuses ``options``); a statement timeout is set per
    transaction (``local_statement_timeout``). A multi-host URL reaches only the writer
    (``writer_params``); ``connect_timeout`` holds for each host it tries.
    """
    try:
        conn = psycopg.connect(
            dsn,
            **writer_params(dsn),
            autocommit=True,
            row_factory=dict_row,
            application_name=application_name,
            connect_timeout=max(1, round(connect_timeout)),
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
            tcp_user_timeout=max(1000, int(connect_timeout * 1000)),
        )
    except psycopg.ProgrammingError as exc:  # a connection string psycopg cannot use
        raise ConfigError("JOBFENCE_DATABASE_URL is not a usable connection string: "
                          f"{_first_line(exc)}") from exc
    except psycopg.Error as exc:
        if writer_params(dsn) and no_writer(exc):
            raise NotWriter("database unavailable: no host of JOBFENCE_DATABASE_URL takes "
                            "writes (each is a replica or read-only, or cannot be reached): "
                            f"{_first_line(exc)}") from exc
        raise translate(exc) from exc
    if pooler == "transaction":
        conn.prepare_threshold = None
    watch(conn)
    return conn


def confirm_durable(conn: Connection) -> None:
    """Return once everything this connection's server committed before now is durable as
    the server's replication promises it (with a synchronous standby: on the standby too):
    one transaction that writes to the WAL (a logical message, which nothing reads) commits,
    and a commit waits for its standby's acknowledgement of the WAL up to it — every earlier
    commit included. (A transaction that only takes an id writes no WAL of its own and does
    not wait.) ``Unreplicated`` or ``NotWriter`` when it cannot be confirmed here. For an
    outcome read back after a lost connection: seen on a primary that is then lost, a
    commit is not yet a survivor."""
    with replacing(conn), translated():
        row = conn.execute(
            "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE "
            "pg_logical_emit_message(true, 'jobfence', 'durable') END AS lsn",
            prepare=False).fetchone()
    check_replicated(conn)
    if row is None or row["lsn"] is None:
        mark_stale(conn)
        raise NotWriter("database unavailable: the server is a replica: nothing can be "
                        "confirmed durable there")



class Pool:
    """Connections for a long-lived server (``jobfence serve``): at most ``size`` open at
    once, each checked before it is lent and set up as ``connect`` sets one up (autocommit,
    dict rows, keepalives; nothing prepared behind a transaction pooler). Waiting longer
    than ``wait`` for one is ``StoreUnavailable``."""

    def __init__(self, dsn: str, *, size: int, pooler: str = "none",
                 application_name: str = "jobfence", connect_timeout: float = 5.0,
                 wait: float = 10.0) -> None:
        from psycopg_pool import ConnectionPool

        def configure(conn: Connection) -> None:
            if pooler == "transaction":
                conn.prepare_threshold = None
            watch(conn)

        self.wait = wait
        self._own = (dsn, pooler, application_name, connect_timeout)
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            dsn, min_size=1, max_size=size, open=False, name=application_name,
            timeout=wait, configure=configure, check=ConnectionPool.check_connection,
            kwargs={"autocommit": True, "row_factory": dict_row,
                    "application_name": application_name, **writer_params(dsn),
                    "connect_timeout": max(1, round(connect_timeout)), "keepalives": 1,
                    "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
                    "tcp_user_timeout": max(1000, int(connect_timeout * 1000))})

    def open(self) -> None:
        """Start filling the pool (without waiting for the database: a server starts, and
        says it is not ready, while the database is down)."""
        self._pool.open(wait=False)

    def close(self) -> None:
        self._pool.close(timeout=5.0)

    def fresh(self) -> Connection:
        """A connection of its own, outside the pool, made as the pool makes them (its
        caller closes it): what an outcome lost with a lent one is found out on."""
        dsn, pooler, name, timeout = self._own
        return connect(dsn, pooler=pooler, application_name=name, connect_timeout=timeout)

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        from psycopg_pool import PoolTimeout

        try:
            with self._pool.connection() as conn:
                try:
                    yield conn
                except StoreUnavailable:
                    if stale(conn):  # on a replica: the pool must not lend it again
                        conn.close()
                    raise
        except PoolTimeout as exc:
            raise StoreUnavailable(f"database unavailable: no connection within "
                                   f"{self.wait:g} s") from exc
        except psycopg.Error as exc:
            raise translate(exc) from exc


@contextmanager
def deadline(conn: Connection, seconds: float) -> Iterator[None]:
    """Give up on ``conn`` once ``seconds`` have passed inside the block: its socket is shut
    down, so the statement in flight fails here (``StoreUnavailable``: its outcome unknown)
    and the connection is replaced. Never a cancel: a cancelled wait for a synchronous
    standby makes PostgreSQL report the commit as a success although no standby has it —
    a heartbeat "renewed" on an isolated old primary. Measured by the client, so it holds
    through any pooler and changes no session setting."""
    done = threading.Event()
    timer = threading.Timer(seconds, _hang_up, args=(conn, done))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        done.set()
        timer.cancel()


def _hang_up(conn: Connection, done: threading.Event) -> None:
    """Shut the connection's socket down (not the descriptor: its owner closes that)."""
    if done.is_set():
        return
    mark_stale(conn)
    with contextlib.suppress(Exception):  # already closed: nothing to hang up
        sock = socket.socket(fileno=conn.pgconn.socket)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()  # the descriptor stays psycopg's


def cancel_quietly(conn: Connection) -> None:
    """Cancel what ``conn`` is running, if anything (from another thread)."""
    with contextlib.suppress(Exception):  # a broken connection has nothing to cancel
        conn.cancel_safe(timeout=2.0)


def callers(conn: object) -> Connection:
    """An application's own connection, checked for use by the Python API: a psycopg 3
    connection, open, not inside a failed transaction. On a connection that is not in
    autocommit mode and has no transaction yet, the transaction psycopg would begin on the
    next statement is begun now: what the API writes is then part of it (a savepoint),
    and the application's own commit or rollback decides, as for its other statements."""
    if not isinstance(conn, psycopg.Connection):
        raise TypeError(f"expected a psycopg.Connection, got {type(conn).__name__}")
    if conn.closed:
        raise StoreUnavailable("the connection is closed")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise StoreError("the connection's transaction has failed: roll it back first")
    if status == TransactionStatus.ACTIVE:
        raise StoreError("the connection is running another statement")
    if not conn.autocommit and status == TransactionStatus.IDLE:
        with translated():
            conn.execute("SELECT 1", prepare=False)  # psycopg's implicit BEGIN comes with it
    return conn


def conninfo(conn: Connection) -> str:
    """The connection's parameters, without its password."""
    return conn.info.dsn


def in_transaction(conn: Connection) -> bool:
    """Whether the caller has a transaction open on ``conn``."""
    return conn.info.transaction_status != TransactionStatus.IDLE


# -- errors ----------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


REFUSALS: dict[str, type[JobfenceError]] = {
    "JF409": JobAlreadyTerminal, "JF410": NotRetryable, "JF503": Drained}
"""The SQLSTATEs jobfence's own functions refuse with (class JF), and the typed error each
one is (JF404, a job not found, carries the job id as its detail)."""


def translate(exc: BaseException) -> BaseException:
    """Map a psycopg error to the jobfence error a caller can act on."""
    if isinstance(exc, JobfenceError):
        return exc
    if isinstance(exc, psycopg.Error) and exc.sqlstate == "JF404":
        return JobNotFound(exc.diag.message_detail)
    if isinstance(exc, psycopg.Error) and exc.sqlstate in REFUSALS:
        return REFUSALS[exc.sqlstate](exc.diag.message_primary or _first_line(exc))
    if isinstance(exc, pg_errors.UniqueViolation):
        diag = exc.diag
        if diag.constraint_name == "jobs_resource_active":
            return ResourceBusy(_key_value(diag.message_detail))
        return Conflict(f"conflicting write: {diag.message_primary}")
    if isinstance(exc, pg_errors.UndefinedTable | pg_errors.UndefinedFunction
                  | pg_errors.UndefinedColumn | pg_errors.InvalidSchemaName):
        return NotMigrated("the database has no jobfence schema, or an older one than this "
                           f"release needs ({_first_line(exc)}): run `jobfence migrate`",
                           missing=_first_line(exc))
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        # Not committed: the server is a replica (or read-only). A retry on a fresh
        # connection may reach the writer; this one never will (``stale``).
        return NotWriter(f"database unavailable: the server takes no writes (a replica, or "
                         f"a primary being demoted): {_first_line(exc)}")
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


# -- running statements ------------------------------------------------------------------------


def execute(conn: Connection, query: LiteralString | sql.SQL | sql.Composed,
            params: Mapping[str, Any] | None = None, *, row: type[T] | None = None) -> Cursor:
    """Run one statement; psycopg errors come out as jobfence errors. With ``row``, rows
    come back as that dataclass (its fields named like the statement's columns)."""
    with replacing(conn), translated():
        # The cursor's own row factory: an application's connection keeps its own.
        cur: Cursor = conn.cursor(row_factory=dict_row if row is None else class_row(row))
        done = cur.execute(query, params)
    check_replicated(conn)
    return done


@contextmanager
def transaction(conn: Connection) -> Iterator[None]:
    """A transaction (a savepoint inside the caller's); errors translated."""
    with replacing(conn), translated(), conn.transaction():
        yield
    check_replicated(conn)


@contextmanager
def pipeline(conn: Connection) -> Iterator[Callable[[], None]]:
    """Pipeline mode: statements go out together and their results come back together, in
    one round trip. Statements share one implicit transaction up to each call of the
    yielded ``sync`` (which commits them), so a statement after ``sync`` runs after that
    commit."""
    with replacing(conn), translated(), conn.pipeline() as p:
        yield p.sync
    check_replicated(conn)


def lock_params(name: str) -> dict[str, int]:
    """Advisory-lock keys for a lock name (e.g. a function's name)."""
    return {"namespace": LOCK_NAMESPACE, "key": zlib.crc32(name.encode()) & 0x7FFFFFFF}


# -- notifications --------------------------------------------------------------------------


def listen(conn: Connection, channel: str) -> None:
    """LISTEN on ``channel`` (any text: quoted as an identifier)."""
    execute(conn, sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def notified(conn: Connection, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for one notification on a listening connection."""
    with translated():
        return any(True for _ in conn.notifies(timeout=max(0.0, timeout), stop_after=1))


def readable(conn: Connection, timeout: float, also: int | None = None) -> bool:
    """Whether the server sent something (a notification) within ``timeout`` seconds; waits
    on the socket without taking the connection, so another thread may use it meanwhile.
    With ``also`` (a descriptor), the wait ends as soon as that is readable too."""
    # Closed or lost meanwhile (psycopg raises its own error from ``fileno`` then): nothing
    # to read; whoever uses the connection next finds it gone and connects again.
    with contextlib.suppress(OSError, ValueError, psycopg.Error):
        fd = conn.fileno()
        ready = select.select([fd] if also is None else [fd, also], [], [],
                              max(0.0, timeout))[0]
        return fd in ready
    return False


def payloads(conn: Connection) -> list[str]:
    """The payloads of the notifications received so far on a listening connection, without
    waiting."""
    with translated():
        return [n.payload for n in conn.notifies(timeout=0.0)]
