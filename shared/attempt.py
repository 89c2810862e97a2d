"""Keeping one claimed attempt honest while its actions run.

``AttemptGuard`` renews the lease from a heartbeat thread on its own connection, and a
watchdog thread stops the attempt the moment it may no longer run (both threads belong to
the worker process, ``GuardThreads``, and serve one attempt after another):

* the heartbeat matched nothing, or the stop check found the fence gone — the fence was
  rotated (cancel, reclaim, run timeout): ``fence_lost``, logged as
  ``writeback_stale_attempt``. Between heartbeats the heartbeat thread asks every
  ``JOBFENCE_STOP_CHECK_SECONDS`` (a one-row read) whether the attempt still holds its
  fence, and where its connection can LISTEN the database tells it at once (channel
  ``<schema>.stop``): a cancel reaches the command within a second, not at the next
  heartbeat (invariant 12);
* the lease could not be renewed and its local deadline is near (database unreachable, or
  the process was paused past it): ``lease_expired``, self-fencing;
* the job's run timeout passed: ``timed_out``;
* the worker got SIGTERM: ``sigterm``.

Stopping means: set ``stop`` (actions wait on it), SIGKILL every process group the action
registered and every other descendant of the worker (``jobfence.proctree``), and from then
on write nothing — except the SIGTERM and timeout paths, which give the job back with a
fenced write. SIGTERM (an eviction, a drain) is not the job's fault: its attempt is given
back (``Store.interrupt``), up to ``JOBFENCE_MAX_INTERRUPTIONS`` times.

The local deadline is measured on the monotonic clock from *before* each successful
heartbeat was sent, so it always falls before the database's own deadline; the database's
``visible_at > clock_timestamp()`` predicate backs it up.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from enum import StrEnum
from typing import TypeVar

from jobfence import db
from jobfence.db import Connection, connect, deadline
from jobfence.errors import StoreUnavailable
from jobfence.logs import get_logger
from jobfence.proctree import kill_descendants, kill_group
from jobfence.settings import Settings, self_fence_margin
from jobfence.store import Claim, Store, Transition

log = get_logger("jobfence.attempt")
T = TypeVar("T")


class StopReason(StrEnum):
    FENCE_LOST = "fence_lost"
    LEASE_EXPIRED = "lease_expired"
    TIMED_OUT = "timed_out"
    SIGTERM = "sigterm"


class SideChannel:
    """The guard's own connection (heartbeats, stop checks, SIGTERM release), reconnected
    on demand and used by one thread at a time. Where the connection keeps its session (no
    transaction pooler) it listens on ``<schema>.stop``, where the database names each job
    whose running attempt it stopped (a cancel, a run timeout)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self._conn: Connection | None = None
        self._store_of_conn: Store | None = None
        self.timeout = max(0.2, min(settings.heartbeat, 5.0))
        self.listens = settings.database_pooler != "transaction"
        self._listening = False

    def _store(self) -> Store:
        if self._conn is None or self._conn.closed or self._conn.broken:
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
        the first (without holding the connection meanwhile); empty when not listening."""
        conn = self._conn
        if not self._listening or conn is None or not db.readable(conn, timeout):
            return set()
        with self.lock:
            if conn is not self._conn:
                return set()
            try:
                return set(db.payloads(conn))
            except StoreUnavailable:
                self.close_quietly()
                return set()

    def call(self, fn: Callable[[Store], T]) -> T:
        """``fn`` within a short deadline: a heartbeat must never block past the lease."""
        with self.lock:
            try:
                store = self._store()
                with deadline(store.conn, self.timeout):
                    return fn(store)
            except StoreUnavailable:
                self.close_quietly()
                raise

    def close_quietly(self) -> None:
        self._listening = False
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail
                self._conn.close()
            self._conn = None


class GuardThreads:
    """The heartbeat and watchdog threads of a worker process: started with its first
    attempt and handed each attempt in turn, so that a worker running many short jobs does
    not start two threads per job. Each thread runs the current attempt's loop until that
    attempt closes or stops, then waits for the next one; an attempt that closes before a
    thread gets to it had nothing left to guard."""

    def __init__(self, *, join_timeout: float) -> None:
        self.join_timeout = join_timeout
        self._cond = threading.Condition()
        self._current: AttemptGuard | None = None
        self._closing = False
        self._threads: list[threading.Thread] = []

    def attach(self, guard: AttemptGuard) -> None:
        with self._cond:
            self._current = guard
            if not self._threads:
                self._threads = [
                    threading.Thread(target=self._serve, args=(loop,), name=loop, daemon=True)
                    for loop in ("heartbeat", "watchdog")]
                for t in self._threads:
                    t.start()
            self._cond.notify_all()

    def detach(self, guard: AttemptGuard) -> None:
        with self._cond:
            if self._current is guard:
                self._current = None

    def close(self) -> None:
        """Stop both threads once the current attempt's loops are done; call before the
        connections they use are closed."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for t in self._threads:
            if t is not threading.current_thread() and t.is_alive():
                t.join(timeout=self.join_timeout)

    def _serve(self, loop: str) -> None:
        served: AttemptGuard | None = None
        while True:
            with self._cond:
                while not self._closing and (self._current is None
                                             or self._current is served):
                    self._cond.wait()
                if self._closing:
                    return
                served = self._current
            assert served is not None
            if loop == "heartbeat":
                served.heartbeat_loop()
            else:
                served.watchdog_loop()


class AttemptGuard:
    """Heartbeat, deadlines and the kill switch of one attempt."""

    def __init__(self, claim: Claim, settings: Settings, side: SideChannel,
                 threads: GuardThreads, clock: Callable[[], float] = time.monotonic) -> None:
        self.claim = claim
        self.settings = settings
        self.side = side
        self.threads = threads
        self.clock = clock
        self.stop = threading.Event()
        self.reason: StopReason | None = None
        self.margin = self_fence_margin(settings.lease_seconds)
        now = clock()
        # The claim's lease started at the database's now; ours starts no later than here.
        self._deadline = now + settings.lease_seconds
        self._run_deadline = self._local_run_deadline(now)
        self._next_beat = now + settings.heartbeat
        self._next_check = now + settings.stop_check_seconds
        self._pgids: set[int] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def _local_run_deadline(self, now: float) -> float | None:
        claim = self.claim
        if claim.run_deadline_at is None:
            return None
        claimed_at = claim.lease_expires_at - timedelta(seconds=self.settings.lease_seconds)
        return now + (claim.run_deadline_at - claimed_at).total_seconds()

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> AttemptGuard:
        self.threads.attach(self)
        return self

    def __exit__(self, *exc: object) -> None:
        # Not waited for: both loops wake on _closed and return without writing, and a
        # worker running many jobs should not wait for them after each one.
        self._closed.set()
        self.threads.detach(self)

    # -- what actions and the worker use ---------------------------------------------------

    def track(self, pgid: int) -> None:
        with self._lock:
            self._pgids.add(pgid)
        if self.stop.is_set():
            kill_group(pgid)

    def untrack(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)

    def lease_live(self) -> bool:
        """Whether the local lease deadline is still beyond the self-fencing margin."""
        return self.clock() < self._deadline - self.margin

    def request_stop(self, reason: StopReason) -> bool:
        """Stop the attempt now; the first reason wins. Kills every registered process
        group at once."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
            self.stop.set()
            pgids = list(self._pgids)
        for pgid in pgids:
            kill_group(pgid)
        kill_descendants(reap_children=False)  # what left the groups (setsid, daemons)
        return True

    def release_on_sigterm(self) -> Transition | None:
        """The SIGTERM path, run by the shutdown watcher while the main thread may still be
        blocked inside an action: stop, kill, and give the job back at once."""
        self.request_stop(StopReason.SIGTERM)
        claim = self.claim
        try:
            t: Transition | None = self.side.call(lambda store: store.attempts.interrupt(
                job_id=claim.job_id, attempt_id=claim.attempt_id,
                reason="worker received SIGTERM",
                max_interruptions=self.settings.max_interruptions))
        except StoreUnavailable as exc:
            log.error("sigterm_release_failed", job_id=str(claim.job_id), error=str(exc))
            return None
        log.warning("sigterm_released", job_id=str(claim.job_id),
                    attempt_id=str(claim.attempt_id), status=t.status if t else None)
        return t

    # -- threads ---------------------------------------------------------------------------

    def heartbeat_loop(self) -> None:
        """Renew the lease when due; between renewals, look for a stop (told by the
        database, or asked every ``stop_check_seconds``). Wakes at least every 0.1 s to see
        whether the attempt ended."""
        while not self.stop.is_set():
            wait = min(0.1, max(0.0, min(self._next_beat, self._next_check) - self.clock()))
            if self.side.listening:
                told = self.side.told(wait)
                if self._closed.is_set():
                    return
                if str(self.claim.job_id) in told:
                    if not self.check():
                        return
                    continue
            elif self._closed.wait(wait):
                return
            now = self.clock()
            if now >= self._next_beat:
                if not self.beat():
                    return
            elif now >= self._next_check and not self.check():
                return

    def check(self) -> bool:
        """One stop check: does this attempt still hold its fence with a live lease? Stops
        the attempt when it does not. False when the attempt's checks are over."""
        if self.stop.is_set() or self.deadline_passed():
            return False
        claim, every = self.claim, self.settings.stop_check_seconds
        try:
            held = self.side.call(lambda store: store.attempts.holding(
                [(claim.job_id, claim.attempt_id)]))
        except StoreUnavailable as exc:  # the heartbeat and the watchdog see to that
            log.debug("stop_check_failed", job_id=str(claim.job_id), error=str(exc))
            self._next_check = self.clock() + every
            return True
        if self._closed.is_set():
            return False
        if claim.job_id not in held:
            if self.request_stop(StopReason.FENCE_LOST):
                self._log_fence_lost()
            return False
        # Told at once where the connection listens: asking is then only the safety net.
        self._next_check = self.clock() + (every * 10 if self.side.listening else every)
        return True

    def beat(self) -> bool:
        """One heartbeat, due now: renew the lease, or find the fence lost, or keep trying
        sooner when the database cannot be reached (the watchdog self-fences if the lease
        runs out meanwhile). False when the attempt's heartbeats are over."""
        if self.stop.is_set() or self.deadline_passed():
            return False  # e.g. resumed after SIGSTOP: too late to renew, write nothing
        claim, lease = self.claim, self.settings.lease_seconds
        sent = self.clock()
        try:
            renewed = self.side.call(lambda store: store.attempts.heartbeat(
                job_id=claim.job_id, attempt_id=claim.attempt_id, lease_seconds=lease))
        except StoreUnavailable as exc:
            log.warning("heartbeat_failed", job_id=str(claim.job_id), error=str(exc))
            self._next_beat = self.clock() + min(self.settings.heartbeat, 1.0)
            return True
        if self._closed.is_set():
            return False
        if renewed is None:
            if self.request_stop(StopReason.FENCE_LOST):
                self._log_fence_lost()
            return False
        self._deadline = sent + lease
        self._next_beat = sent + self.settings.heartbeat
        return True

    @property
    def next_beat(self) -> float:
        """When the next heartbeat is due, on the guard's clock."""
        return self._next_beat

    def _log_fence_lost(self) -> None:
        claim = self.claim
        try:
            now = self.side.call(lambda store: store.attempts.fence(claim.job_id,
                                                                    claim.attempt_id))
        except StoreUnavailable:
            now = None
        log.warning("writeback_stale_attempt", job_id=str(claim.job_id),
                    attempt_id=str(claim.attempt_id),
                    job_status=now.status if now else None,
                    why=now.reason if now else None,
                    message="the fence was rotated: this attempt stops and writes nothing")

    def deadline_passed(self) -> bool:
        """Stop the attempt if a deadline has passed; True if it has."""
        now = self.clock()
        if self._run_deadline is not None and now >= self._run_deadline:
            if self.request_stop(StopReason.TIMED_OUT):
                log.warning("run_timed_out", job_id=str(self.claim.job_id))
            return True
        if now >= self._deadline - self.margin:
            if self.request_stop(StopReason.LEASE_EXPIRED):
                log.error("self_fenced", job_id=str(self.claim.job_id),
                          attempt_id=str(self.claim.attempt_id), pid=os.getpid(),
                          message="lease could not be renewed in time: stopped the "
                                  "action; this attempt writes nothing more")
            return True
        return False

    def watchdog_loop(self) -> None:
        while not self.stop.is_set():
            if self.deadline_passed():
                return
            now = self.clock()
            wake = min(self._deadline - self.margin,
                       self._run_deadline if self._run_deadline is not None else now + 1.0)
            if self._closed.wait(min(max(0.0, wake - now), 0.25)):
                return


