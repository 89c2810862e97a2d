"""A worker told at once when its queue has work ready.

Where its connections keep their sessions (no transaction pooler), a worker that waits for
work — ``--idle-seconds``, or free slots beside running ones — listens on
``<schema>.ready`` on a connection of its own. The database names there the queue of every
job that became ready now, in the transaction that made it so (an enqueue, a retry or a job
given back with no delay, dependencies satisfied): one notification per queue and
statement, delivered at commit. The loop then looks at once instead of at its next poll.

The poll stays, at the same pace: a notification lost with its connection costs one poll
interval, a job that becomes ready by the clock (``run_at``, a retry's delay) is found by
it, and behind a transaction pooler, where ``LISTEN`` is unavailable, it is the only way.
A lost connection is opened again (backing off to a second); a notification of another
queue is ignored.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

from jobfence import db
from jobfence.db import Connection, connect
from jobfence.errors import JobfenceError
from jobfence.logs import get_logger
from jobfence.settings import Settings

log = get_logger("jobfence.worker")

LOOK_SECONDS = 0.5
"""How long the listening thread waits on its socket before it looks whether its
connection was closed (it wakes at once for a notification, and for ``close``)."""

BACKOFF_SECONDS = (0.1, 1.0)
"""Between attempts to listen again after the connection was lost: the first, the most."""


def channel(schema: str) -> str:
    """The channel where the database names the queues that have work ready."""
    return f"{schema}.ready"


class Wakeup:
    """A thread listening for ready work on ``queue``; ``wake`` runs on it for each
    notification of that queue (and once each time it starts listening, for what became
    ready while it was not). Nothing at all behind a transaction pooler."""

    def __init__(self, settings: Settings, queue: str, wake: Callable[[], None]) -> None:
        self.settings = settings
        self.queue = queue
        self.wake = wake
        self.enabled = settings.can_listen
        self.listening = threading.Event()
        self.times_listened = 0
        """How many times a connection started listening (1 unless one was lost)."""
        self._closed = threading.Event()
        self._stop_r, self._stop_w = os.pipe()  # close() writes: the wait ends at once
        self._conn: Connection | None = None
        self._thread = threading.Thread(target=self._run, name="jobfence-wakeup", daemon=True)
        if self.enabled:
            self._thread.start()

    def _run(self) -> None:
        pause = BACKOFF_SECONDS[0]
        while not self._closed.is_set():
            try:
                self._listen()
                pause = BACKOFF_SECONDS[0]
            except Exception as exc:  # unreachable, lost, or a bug: the poll goes on
                log.warning("wakeup_lost", error=str(exc) if isinstance(exc, JobfenceError)
                            else repr(exc), retry_in=pause)
            finally:
                self.listening.clear()
                self._close_conn()
            self._closed.wait(pause)
            pause = min(pause * 2, BACKOFF_SECONDS[1])

    def _listen(self) -> None:
        conn = self._conn = connect(
            self.settings.database_url, pooler=self.settings.database_pooler,
            application_name="jobfence-wakeup",
            connect_timeout=self.settings.connect_timeout_seconds)
        db.listen(conn, channel(self.settings.schema_name))
        self.times_listened += 1
        self.listening.set()
        self.wake()  # what became ready while nothing listened is looked for now
        while not self._closed.is_set():
            if db.readable(conn, LOOK_SECONDS, also=self._stop_r):
                # A closed or broken connection reads as readable: payloads raises then.
                if self.queue in db.payloads(conn):
                    self.wake()
            elif conn.closed:
                return

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail
                conn.close()

    def close(self) -> None:
        """Stop listening: the thread ends at once (its connection closed)."""
        if self._closed.is_set():
            return
        self._closed.set()
        os.write(self._stop_w, b"x")
        if self._thread.is_alive():
            self._thread.join(LOOK_SECONDS * 2)
        if not self._thread.is_alive():
            os.close(self._stop_r)
            os.close(self._stop_w)
