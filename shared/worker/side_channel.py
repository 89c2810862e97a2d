"""The guards' own connection: heartbeats, stop checks and the SIGTERM give-back go through
it, never through the connection the executions write on (a heartbeat must not wait behind
a batch of terminal writes, nor a give-back behind a heartbeat)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

from jobfence import db
from jobfence.db import Connection, connect, deadline
from jobfence.errors import JobfenceError, StoreUnavailable
from jobfence.settings import Settings
from jobfence.store import Store

T = TypeVar("T")


class SideChannel:
    """The guards' own connection (heartbeats, stop checks, SIGTERM give-back), reconnected
    on demand and used by one thread at a time. Where the connection keeps its session (no
    transaction pooler) it listens on ``<schema>.stop``, where the database names each job
    whose running attempt it stopped (a cancel, a run timeout)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self._conn: Connection | None = None
        self._store_of_conn: Store | None = None
        self.timeout = max(0.2, min(settings.heartbeat, 5.0))
        self.listens = settings.can_listen
        self._listening = False

    def _store(self) -> Store:
        if self._conn is None or db.stale(self._conn):
            self._listening = False
            self._conn = connect(self.settings.database_url,
                                 pooler=self.settings.database_pooler,
                                 application_name="jobfence-heartbeat",
                                 connect_timeout=min(self.settings.connect_timeout_seconds,
                                                     self.settings.heartbeat))
            self._store_of_conn = Store(self._conn, self.settings.schema_name)
            if self.listens:
                # Before any statement on this connection: whatever that statement finds,
                # a stop made after it is told here.
                db.listen(self._conn, f"{self.settings.schema_name}.stop")
                self._listening = True
        assert self._store_of_conn is not None
        return self._store_of_conn

    @property
    def listening(self) -> bool:
        """Whether the database tells this connection of stopped attempts."""
        return self._listening

    def told(self, timeout: float) -> set[str]:
        """The job ids the database said it stopped, waiting up to ``timeout`` seconds for
        the first (without holding the connection meanwhile); empty when not listening. A
        notification that arrived while a heartbeat or a check ran on the connection was
        read with that statement's answer and waits in the driver, not on the socket: it is
        taken first."""
        conn = self._conn
        if not self._listening or conn is None:
            return set()
        found = self._payloads(conn)
        if found or conn is not self._conn:  # told, or the connection was lost meanwhile
            return found
        if not db.readable(conn, timeout):
            return found
        return self._payloads(conn)

    def _payloads(self, conn: Connection) -> set[str]:
        with self.lock:
            if conn is not self._conn:
                return set()
            try:
                return set(db.payloads(conn))
            except StoreUnavailable:
                self.close_quietly()
                return set()

    def call(self, fn: Callable[[Store], T], *, wait: float | None = None) -> T:
        """``fn`` within a short deadline: a heartbeat must never block past the lease.
        With ``wait``, a connection of its own when this one is busy for longer (the SIGTERM
        give-back must not wait for a heartbeat in flight)."""
        if wait is not None and not self.lock.acquire(timeout=wait):
            own = SideChannel(self.settings)
            own.listens = False
            try:
                return own.call(fn)
            finally:
                own.close_quietly()
        elif wait is None:
            self.lock.acquire()
        try:
            try:
                store = self._store()
                with deadline(store.conn, self.timeout):
                    return fn(store)
            except StoreUnavailable:
                self.close_quietly()
                raise
            except JobfenceError:  # the database's answer: the connection is fine
                raise
            except Exception:  # not an answer: whatever state the connection is in, not reused
                self.close_quietly()
                raise
        finally:
            self.lock.release()

    def close_quietly(self) -> None:
        self._listening = False
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail
                self._conn.close()
            self._conn = None
