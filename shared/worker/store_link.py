"""The worker's own connection and what goes through it: claims, the fenced writes of its
executions, and their terminal writes — in batches.

Executions that finish at about the same time share one round trip: each hands its terminal
write to ``StoreLink.finish`` and waits; whichever finds the connection free writes every
write handed in so far in one statement (``worker_finish_many``: each row matched on its
own job and attempt, the rows that matched returned) and, in the same transaction, claims
the next job for each execution that asked for one (``worker_claim``: each row a fresh
``attempt_id``). No thread waits for a batch to fill: a worker running one job at a time
writes each job's terminal write alone, with its next claim, in one round trip and one
commit, as before; a worker running many writes for as many as finished while the last
round trip was in flight.

A write that cannot reach the database is tried again, reconnecting, while the lease
holds (every write is fenced: a repeat is harmless); a batch whose outcome was lost with
the connection is written again without its claims, and a row that then matches nothing
is looked up: had the first try committed it? A batch the database refuses for a reason of
its own (a value it will not take) is written again row by row, so that only the row at
fault is refused.

Every claim is named (``claim_id``, a fresh uuid per claim statement). A claim whose answer
was lost with its connection — alone or riding on a batch — may have committed: the jobs it
took would then be held, unrun, until their leases ran out, each with an attempt spent. Its
jobs are given back by that name as soon as the database answers again, pending at once and
their attempts not spent (``release_claim``); tried again, at most once a second, until its
lease would have run out (its transaction may still be committing when first asked).

Connection use is serialized here (one statement at a time): the heartbeat, the stop
checks and the SIGTERM give-back have a connection of their own (``jobfence.worker.guard``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar
from uuid import UUID, uuid4

from jobfence.db import Connection, confirm_durable, connect, deadline, stale
from jobfence.errors import JobfenceError, StoreUnavailable
from jobfence.logs import get_logger
from jobfence.settings import Settings
from jobfence.store import Claim, ClaimRequest, Store, TerminalWrite
from jobfence.worker.guard import Guard

log = get_logger("jobfence.worker")
T = TypeVar("T")

RETRY_SECONDS = 0.2
"""How long a write waits before it reconnects and tries again."""

LOST_CLAIM_RETRY_SECONDS = 1.0
"""How often the jobs of a claim whose answer was lost are asked for again while none was
found (its transaction may still be committing)."""


LOST_CLAIM_EXIT_SECONDS = 5.0
"""How long a worker on its way out keeps asking for the jobs of a claim whose answer was
lost (its transaction may still be committing) before it leaves them to their leases."""


class WriteRefused(Exception):
    """A fenced write failed for a reason of its own (a value the database would not take,
    a constraint): retrying it cannot help."""

    def __init__(self, cause: JobfenceError) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Finished:
    """What became of one terminal write: ``written`` (its fence held), and the claim that
    rode on it when one was asked for and a job was ready."""

    written: bool
    next_claim: Claim | None = None
    refused: WriteRefused | None = None


@dataclass
class _Handed:
    guard: Guard
    write: TerminalWrite
    wants_next: bool
    done: threading.Event = field(default_factory=threading.Event)
    result: Finished = Finished(False)


class StoreLink:
    """One worker's connection for claims and fenced writes, shared by its executions."""

    def __init__(self, settings: Settings, queue: str) -> None:
        self.settings = settings
        self.queue = queue
        self._lock = threading.Lock()  # the connection: one statement at a time
        self._handed_lock = threading.Lock()
        self._handed: list[_Handed] = []
        self._lost: dict[UUID, float] = {}
        """Claims whose answer was lost, not given back yet: their ids, and until when
        (monotonic) to ask — their lease, counted from the send."""
        self._lost_asked = 0.0
        self._unknown: set[tuple[UUID, UUID]] = set()
        """Terminal writes whose outcome was lost with the connection, not settled yet."""
        self.store = self._connect()

    def _connect(self) -> Store:
        conn: Connection = connect(
            self.settings.database_url, pooler=self.settings.database_pooler,
            application_name="jobfence-worker",
            connect_timeout=self.settings.connect_timeout_seconds)
        return Store(conn, self.settings.schema_name)

    def _reconnect(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection may fail
            self.store.conn.close()
        self.store = self._connect()

    def close(self) -> None:
        with self._lock:
            until = time.monotonic() + LOST_CLAIM_EXIT_SECONDS
            while self._lost:  # last tries: a lost claim's jobs, not held till their lease
                with _quietly():
                    self._give_back_lost(force=True)
                if not self._lost or time.monotonic() >= until:
                    break
                time.sleep(LOST_CLAIM_RETRY_SECONDS / 4)
            for claim_id in self._lost:  # not committed, or held till its lease runs out
                log.warning("claim_outcome_left", claim_id=str(claim_id),
                            message="no job of it found at exit: it did not commit, or its "
                                    "jobs wait for their leases to run out (the sweeper)")
            self.store.conn.close()

    def leave(self) -> None:
        """The worker is forced out (SIGTERM, and an action that would not stop): say what
        it leaves unknown — like a SIGKILL, the leases decide (the sweeper reclaims; a
        late commit of the first try is the only one the fence lets count). Not under the
        connection's lock: its holder may be the one stuck."""
        for job_id, attempt_id in list(self._unknown):
            log.warning("outcome_left", job_id=str(job_id), attempt_id=str(attempt_id),
                        message="its terminal write's outcome unknown at a forced exit")
        for claim_id in list(self._lost):
            log.warning("claim_outcome_left", claim_id=str(claim_id),
                        message="its jobs unknown at a forced exit")

    def _fresh(self) -> Store:
        """The store, on a new connection when the last one broke (a database restart, a
        terminated backend) or was found on a server that takes no writes (a demoted
        primary): a claim after an outage the writes rode out must not fail on the
        connection they left behind."""
        if stale(self.store.conn):
            self._reconnect()
        return self.store

    def _usable(self) -> Store:
        """``_fresh``, once the jobs of any claim whose answer was lost are given back."""
        self._fresh()
        if self._lost:
            self._give_back_lost()
        return self.store

    def request(self, limit: int) -> ClaimRequest:
        """A claim of up to ``limit`` jobs, named afresh."""
        return ClaimRequest(self.settings.worker, self.settings.lease_seconds, self.queue,
                            limit, uuid4())

    # -- claims whose answer was lost ---------------------------------------------------------

    def _lost_claim(self, r: ClaimRequest, sent: float, exc: StoreUnavailable) -> None:
        """Under the connection's lock: the answer to claim ``r`` was lost with the
        connection; it may have committed. Its jobs are to be given back as soon as the
        database answers."""
        assert r.claim_id is not None
        log.warning("claim_outcome_unknown", claim_id=str(r.claim_id), jobs=r.limit,
                    error=str(exc))
        self._lost[r.claim_id] = sent + r.lease_seconds

    def _give_back_lost(self, force: bool = False) -> None:
        """Under the connection's lock: give back the jobs of each lost claim that took any
        (pending at once, attempts not spent). A claim that matched nothing is asked again,
        at most every LOST_CLAIM_RETRY_SECONDS, until its lease would have run out (then
        nothing of it is held: the sweeper has whatever it took). StoreUnavailable when the
        database does not answer (kept for the next use)."""
        now = time.monotonic()
        if not force and now - self._lost_asked < LOST_CLAIM_RETRY_SECONDS:
            return
        self._lost_asked = now
        for claim_id, until in list(self._lost.items()):
            if now >= until:
                del self._lost[claim_id]
                log.info("claim_outcome_resolved", claim_id=str(claim_id), released=0)
                continue
            try:
                back = self._fresh().attempts.release_claim(
                    claim_id=claim_id, worker_id=self.settings.worker,
                    reason=f"given back by {self.settings.worker}: the answer to its "
                           "claim was lost")
            except StoreUnavailable:
                with _quietly():
                    self._reconnect()
                raise
            except JobfenceError as exc:
                del self._lost[claim_id]
                log.warning("claim_release_refused", claim_id=str(claim_id), error=str(exc))
                continue
            if back:
                del self._lost[claim_id]
                log.info("claim_outcome_resolved", claim_id=str(claim_id),
                         released=len(back), jobs=[str(t.job_id) for t in back])

    # -- claims and fenced writes ------------------------------------------------------------

    def claim(self, limit: int) -> list[Claim]:
        """Claim up to ``limit`` ready jobs of the queue in one statement, each with a fresh
        fence; [] when nothing is ready (or on the way out)."""
        r = self.request(limit)
        with self._lock:
            store = self._usable()
            sent = time.monotonic()
            try:
                claims = store.attempts.claim(
                    worker_id=r.worker_id, lease_seconds=r.lease_seconds, queue=r.queue,
                    limit=r.limit, claim_id=r.claim_id)
            except StoreUnavailable as exc:
                self._lost_claim(r, sent, exc)
                with _quietly():  # now, if the database answers again at once
                    self._give_back_lost(force=True)
                raise
            return [c._replace(sent=sent) for c in claims]

    def read(self, fn: Callable[[Store], T]) -> T:
        """A read on the worker's connection (no retry: the caller decides)."""
        with self._lock:
            return fn(self._usable())

    def write(self, guard: Guard, fn: Callable[[Store], T],
              even_if_stopped: bool = False) -> T | None:
        """Run a fenced write while the lease is valid, reconnecting if the connection
        dropped. None when this attempt may not (or can no longer) write; WriteRefused
        when the database refused it for a reason of its own."""
        while True:
            if not guard.lease_live() or (guard.stop.is_set() and not even_if_stopped):
                return None
            with self._lock:
                try:
                    return fn(self._usable())
                except StoreUnavailable as exc:
                    log.warning("write_retry", error=str(exc))
                except JobfenceError as exc:
                    raise WriteRefused(exc) from exc
            if guard.stop.wait(RETRY_SECONDS) and not even_if_stopped:
                return None
            with self._lock, _quietly():
                self._reconnect()

    # -- terminal writes, in batches ---------------------------------------------------------

    def finish(self, guard: Guard, write: TerminalWrite, wants_next: bool) -> Finished:
        """The terminal write of one execution, in a batch with those of the others that
        finish meanwhile, and — when ``wants_next`` — the claim of the job that follows it,
        in the same transaction."""
        mine = _Handed(guard, write, wants_next)
        with self._handed_lock:
            self._handed.append(mine)
        with self._lock:
            if not mine.done.is_set():
                with self._handed_lock:
                    batch, self._handed = self._handed, []
                self._write_batch(batch)
        return mine.result

    def _write_batch(self, batch: list[_Handed]) -> None:
        """Under the connection's lock: write ``batch``, and set each one's result."""
        try:
            live = [h for h in batch
                    if h.guard.lease_live() and not h.guard.stop.is_set()]
            self._finish_live(live)
        finally:
            for h in batch:
                h.done.set()

    def _finish_live(self, live: list[_Handed]) -> None:
        if not live:
            return
        asked = [h for h in live if h.wants_next]
        riding = self.request(len(asked)) if asked else None
        sent = time.monotonic()
        try:
            store = self._usable()
            sent = time.monotonic()
            written, claims = store.attempts.finish_many([h.write for h in live],
                                                         claim=riding)
        except StoreUnavailable as exc:
            for h in live:  # the batch may or may not have committed
                self._unknown.add((h.write.job_id, h.write.attempt_id))
                log.warning("outcome_unknown", job_id=str(h.write.job_id),
                            attempt_id=str(h.write.attempt_id), error=str(exc))
            if riding is not None:  # given back once the terminal writes are settled
                self._lost_claim(riding, sent, exc)
            self._again_without_claims(live)
            if riding is not None:
                with _quietly():
                    self._give_back_lost(force=True)
            return
        except JobfenceError as exc:
            log.warning("batch_refused", jobs=len(live), error=str(exc))
            self._row_by_row(live)
            return
        given = iter(c._replace(sent=sent) for c in claims)
        for h in live:
            nxt = next(given, None) if h.wants_next else None
            h.result = Finished(h.write.job_id in written, nxt)

    def _again_without_claims(self, live: list[_Handed]) -> None:
        """The batch's outcome was lost with the connection: write it again (fenced, so a
        repeat is harmless) while the leases hold; a row that now matches nothing may have
        been written by the first try."""
        pending = live
        while pending:
            for h in pending:
                if not h.guard.lease_live() or h.guard.stop.is_set():
                    # No writing any more: what became of the first try is only read.
                    h.result = Finished(self._won_anyway(h.guard, h.write))
            pending = [h for h in pending if h.guard.lease_live() and not h.guard.stop.is_set()]
            if not pending:
                return
            with _quietly():
                self._reconnect()
            try:
                written, _ = self.store.attempts.finish_many([h.write for h in pending])
            except StoreUnavailable as exc:
                log.warning("write_retry", error=str(exc))
                threading.Event().wait(RETRY_SECONDS)
                continue
            except JobfenceError:
                self._row_by_row(pending)
                return
            for h in pending:
                h.result = Finished(self._settled(h, h.write.job_id in written))
            return

    def _row_by_row(self, live: Sequence[_Handed]) -> None:
        """Each write alone, after its batch was refused."""
        for h in live:
            try:
                written, _ = self._usable().attempts.finish_many([h.write])
            except StoreUnavailable:
                h.result = Finished(self._won_anyway(h.guard, h.write))
            except JobfenceError as exc:
                won = self._is_unknown(h.write) and self._won_anyway(h.guard, h.write)
                h.result = Finished(won, refused=None if won else WriteRefused(exc))
            else:
                h.result = Finished(self._settled(h, h.write.job_id in written))

    def _settled(self, h: _Handed, written: bool) -> bool:
        """What a fenced write just did; for one whose first try's outcome was lost, not
        written now means the first try may have been: read back."""
        if not self._is_unknown(h.write):
            return written
        return self._resolved(h.write, True) if written else self._won_anyway(h.guard, h.write)

    def _is_unknown(self, write: TerminalWrite) -> bool:
        return (write.job_id, write.attempt_id) in self._unknown

    def _resolved(self, write: TerminalWrite, written: bool) -> bool:
        """An outcome found out: said, and no longer unknown."""
        self._unknown.discard((write.job_id, write.attempt_id))
        log.info("outcome_resolved", job_id=str(write.job_id),
                 attempt_id=str(write.attempt_id), written=written)
        return written

    def _won_anyway(self, guard: Guard, write: TerminalWrite) -> bool:
        """After a terminal write whose outcome was lost (its connection died during the
        commit): had it committed? Read back on a fresh connection to the writer, and
        counted as written only once confirmed durable there (``confirm_durable``): a
        commit seen on a primary about to be lost is not yet one that survives it. Only
        read, so tried again for up to a lease even after this attempt's own ran out (its
        connection is gone: a commit it did not make by now never comes); unresolved
        after that, it counts as not written, and says so (``outcome_unresolved``)."""
        status = "succeeded" if write.succeeded else "failed"
        until = time.monotonic() + self.settings.lease_seconds
        while True:
            try:
                store = self._usable()
                now = store.attempts.fence(write.job_id, write.attempt_id)
                won = bool(now and now.status == status and now.holds)
                if won:
                    with deadline(store.conn, max(1.0, self.settings.heartbeat)):
                        confirm_durable(store.conn)
                return self._resolved(write, won)
            except StoreUnavailable as exc:
                log.warning("readback_failed", job_id=str(write.job_id),
                            attempt_id=str(write.attempt_id), error=str(exc))
            except JobfenceError as exc:
                return self._unresolved(write, str(exc))
            if time.monotonic() >= until:
                return self._unresolved(write, "no answer within a lease")
            time.sleep(RETRY_SECONDS)
            with _quietly():
                self._reconnect()

    def _unresolved(self, write: TerminalWrite, why: str) -> bool:
        """Counted as not written, and said so: the lease and the sweeper decide."""
        self._unknown.discard((write.job_id, write.attempt_id))
        log.error("outcome_unresolved", job_id=str(write.job_id),
                  attempt_id=str(write.attempt_id), error=why)
        return False


class _quietly:
    """Suppress a failed reconnect: the next try reconnects again."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, JobfenceError)
