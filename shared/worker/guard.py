"""Keeping every running execution of a worker honest while its actions run.

Each execution has a ``Guard``: its lease deadline, its run deadline and its kill switch.
The worker's ``Guards`` keep them all with two threads, however many jobs run at once:

* the heartbeat thread renews every lease the worker holds in one statement per tick
  (``worker_heartbeat_many``, each row matched on its own ``attempt_id``); a job whose row
  did not match has lost its fence — it stops, the others run on. Between ticks it asks
  every ``JOBFENCE_STOP_CHECK_SECONDS`` (one statement for all jobs) whether each attempt
  still holds its fence, and where its connection can LISTEN the database tells it at once
  (channel ``<schema>.stop``): a cancel reaches its command within a second, not at the
  next heartbeat (invariant 12);
* the watchdog thread stops an execution whose lease could not be renewed before its local
  deadline (database unreachable, or the process was paused past it: ``lease_expired``,
  self-fencing, invariant 6), whose run timeout passed (``timed_out``), or whose action has
  written no output and reported no progress for its inactivity timeout (``inactive``).

A stop is one of ``StopReason``: ``fence_lost`` (logged as ``writeback_stale_attempt``),
``lease_expired``, ``timed_out``, ``inactive``, ``sigterm``. Stopping means: set the
guard's ``stop`` (actions wait on it), SIGKILL every process group the action registered
and every other process of that job's tree (``jobfence.worker.proctree``), and from then
on write nothing — except the SIGTERM, timeout and inactivity paths, which give the job
back with a fenced write. SIGTERM (an eviction, a drain) is not the job's fault: every
job in hand is given back in one statement (``worker_interrupt_many``), its attempt not
counted, up to ``JOBFENCE_MAX_INTERRUPTIONS`` times.

The local deadline is measured on the monotonic clock from *before* each successful
heartbeat was sent, so it always falls before the database's own deadline; the database's
``visible_at > clock_timestamp()`` predicate backs it up.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from enum import StrEnum
from typing import TypeVar
from uuid import UUID

from jobfence.errors import JobfenceError, StoreUnavailable
from jobfence.logs import get_logger
from jobfence.settings import Settings, self_fence_margin
from jobfence.store import Claim, Transition
from jobfence.store.types import Fence
from jobfence.worker.proctree import Tree, kill_descendants, kill_group
from jobfence.worker.side_channel import SideChannel

log = get_logger("jobfence.worker")
T = TypeVar("T")


class StopReason(StrEnum):
    FENCE_LOST = "fence_lost"
    LEASE_EXPIRED = "lease_expired"
    TIMED_OUT = "timed_out"
    INACTIVE = "inactive"
    SIGTERM = "sigterm"


class Guard:
    """The lease deadline, the run deadline and the kill switch of one execution."""

    def __init__(self, claim: Claim, settings: Settings,
                 clock: Callable[[], float] = time.monotonic,
                 alone: Callable[[], bool] = lambda: True) -> None:
        self.claim = claim
        self.settings = settings
        self.clock = clock
        self.alone = alone
        """Whether this is the only job the worker runs now (then every descendant of the
        worker is this job's)."""
        self.stop = threading.Event()
        self.reason: StopReason | None = None
        self.margin = self_fence_margin(settings.lease_seconds)
        now = clock()
        # The claim's lease started at the database's now: after the claim was sent.
        start = now if claim.sent is None else min(now, claim.sent)
        self._deadline = start + settings.lease_seconds
        self._run_deadline = self._local_run_deadline(start)
        self._inactivity: float | None = None
        self._active_at = now
        self._pgids: set[int] = set()
        self._sessions: set[int] = set()
        self._lock = threading.Lock()
        self.ending = threading.Event()
        """Set when the execution makes its last write: from then on its own write says
        whether the fence held, and the guards leave it alone."""

    @property
    def job_id(self) -> UUID:
        return self.claim.job_id

    @property
    def held(self) -> tuple[UUID, UUID]:
        return self.claim.job_id, self.claim.attempt_id

    def _local_run_deadline(self, now: float) -> float | None:
        claim = self.claim
        if claim.run_deadline_at is None:
            return None
        claimed_at = claim.lease_expires_at - timedelta(seconds=self.settings.lease_seconds)
        return now + (claim.run_deadline_at - claimed_at).total_seconds()

    # -- what actions and the execution use ------------------------------------------------

    def track(self, pgid: int) -> None:
        with self._lock:
            self._pgids.add(pgid)
            self._sessions.add(pgid)
        if self.stop.is_set():
            kill_group(pgid)

    def untrack(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)

    def kill_tree(self, *, reap_children: bool) -> None:
        """Kill what of the worker's descendants is this job's: all of them while it runs
        alone here (exactly a one-job worker), else its children's sessions and what
        carries its ``JOBFENCE_ATTEMPT_ID``."""
        with self._lock:
            sessions = frozenset(self._sessions)
        kill_descendants(reap_children=reap_children, alone=self.alone,
                         tree=Tree(sessions, f"JOBFENCE_ATTEMPT_ID={self.claim.attempt_id}"
                                   .encode()))

    def begin_action(self, inactivity_seconds: float | None) -> None:
        """An action starts: it may go ``inactivity_seconds`` without output or progress
        (None: for ever)."""
        self._active_at = self.clock()
        self._inactivity = inactivity_seconds

    def touch(self) -> None:
        """The running action wrote output or reported progress."""
        self._active_at = self.clock()

    def lease_live(self) -> bool:
        """Whether the local lease deadline is still beyond the self-fencing margin."""
        return self.clock() < self._deadline - self.margin

    def request_stop(self, reason: StopReason) -> bool:
        """Stop the execution now; the first reason wins. Kills every registered process
        group at once, and what of the job's tree left them."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
            self.stop.set()
            pgids = list(self._pgids)
        for pgid in pgids:
            kill_group(pgid)
        self.kill_tree(reap_children=False)  # setsid, daemons
        return True

    # -- what the worker's threads use -----------------------------------------------------

    def renewed(self, sent: float) -> None:
        """A heartbeat sent at ``sent`` (this clock) renewed the lease."""
        self._deadline = sent + self.settings.lease_seconds

    def fence_lost(self, why: Fence | None) -> None:
        if self.request_stop(StopReason.FENCE_LOST):
            claim = self.claim
            log.warning("writeback_stale_attempt", job_id=str(claim.job_id),
                        attempt_id=str(claim.attempt_id),
                        job_status=why.status if why else None,
                        why=why.reason if why else None,
                        message="the fence was rotated: this attempt stops and writes nothing")

    def deadline_passed(self) -> bool:
        """Stop the execution if a deadline has passed; True if it has."""
        now = self.clock()
        if self._run_deadline is not None and now >= self._run_deadline:
            if self.request_stop(StopReason.TIMED_OUT):
                log.warning("run_timed_out", job_id=str(self.claim.job_id))
            return True
        if self._inactivity is not None and now >= self._active_at + self._inactivity \
                and not self.ending.is_set():
            if self.request_stop(StopReason.INACTIVE):
                log.warning("action_inactive", job_id=str(self.claim.job_id),
                            inactivity_seconds=self._inactivity)
            return True
        if now >= self._deadline - self.margin:
            if self.request_stop(StopReason.LEASE_EXPIRED):
                log.error("self_fenced", job_id=str(self.claim.job_id),
                          attempt_id=str(self.claim.attempt_id), pid=os.getpid(),
                          message="lease could not be renewed in time: stopped the "
                                  "action; this attempt writes nothing more")
            return True
        return False

    def next_deadline(self) -> float:
        """The earliest moment the watchdog must look at this guard again."""
        due = [self._deadline - self.margin]
        if self._run_deadline is not None:
            due.append(self._run_deadline)
        if self._inactivity is not None:
            due.append(self._active_at + self._inactivity)
        return min(due)


class Guards:
    """The guards of every execution a worker runs, kept by one heartbeat thread and one
    watchdog thread for the worker's life (started with its first job: a worker running
    many short jobs starts no thread per job)."""

    def __init__(self, settings: Settings, side: SideChannel | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.side = side or SideChannel(settings)
        self.clock = clock
        self._cond = threading.Condition()
        self._guards: dict[UUID, Guard] = {}
        self._closing = False
        self._terminated = False
        self._threads: list[threading.Thread] = []
        self._next_beat = clock() + settings.heartbeat
        self._next_check = clock() + settings.stop_check_seconds

    # -- executions come and go ------------------------------------------------------------

    def guard(self, claim: Claim) -> Guard:
        """A guard for a new execution, kept from now until ``release``. After SIGTERM
        the guard is stopped at once and its job given back (a claim made meanwhile)."""
        guard = Guard(claim, self.settings, self.clock, alone=self._alone)
        with self._cond:
            idle = not self._guards
            self._guards[claim.job_id] = guard
            terminated = self._terminated
            if not self._threads and not terminated:
                if len(self._guards) == 1:
                    self._next_beat = self.clock() + self.settings.heartbeat
                    self._next_check = self.clock() + self.settings.stop_check_seconds
                self._threads = [
                    threading.Thread(target=loop, name=name, daemon=True)
                    for name, loop in (("heartbeat", self._heartbeat_loop),
                                       ("watchdog", self._watchdog_loop))]
                for t in self._threads:
                    t.start()
            if idle:  # the threads wait for a first guard; a later one needs no wake-up
                self._cond.notify_all()
        if terminated:
            self._give_back([guard])
        return guard

    def release(self, guard: Guard) -> None:
        with self._cond:
            if self._guards.get(guard.job_id) is guard:
                del self._guards[guard.job_id]

    def held(self) -> list[Guard]:
        with self._cond:
            return list(self._guards.values())

    def _alone(self) -> bool:
        with self._cond:
            return len(self._guards) <= 1

    def close(self) -> None:
        """Stop both threads; call before the connections they use are closed."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for t in self._threads:
            if t is not threading.current_thread() and t.is_alive():
                t.join(timeout=self.settings.heartbeat + 6)
        self.side.close_quietly()

    # -- SIGTERM ---------------------------------------------------------------------------

    def give_back_all(self) -> list[Transition]:
        """The SIGTERM path, run by the shutdown watcher while executions may be blocked in
        their actions: stop every one, kill their trees, and give every job back at once,
        in one statement. Every claim made from now on is given back as it arrives."""
        with self._cond:
            self._terminated = True
            guards = list(self._guards.values())
        return self._give_back(guards)

    def _give_back(self, guards: Sequence[Guard]) -> list[Transition]:
        for g in guards:
            g.request_stop(StopReason.SIGTERM)
        if not guards:
            return []
        held = [g.held for g in guards]
        try:
            back = self.side.call(lambda store: store.attempts.interrupt_many(
                held, reason="worker received SIGTERM",
                max_interruptions=self.settings.max_interruptions), wait=0.1)
        except JobfenceError as exc:
            log.error("sigterm_release_failed", jobs=len(held), error=str(exc))
            return []
        for t in back:
            log.warning("sigterm_released", job_id=str(t.job_id), status=t.status)
        return back

    # -- the heartbeat thread ----------------------------------------------------------------

    def _idle(self) -> bool:
        """Wait while there is nothing to guard; False once closing."""
        with self._cond:
            while not self._closing and not self._guards:
                self._cond.wait()
                self._next_beat = self.clock() + self.settings.heartbeat
            return not self._closing

    def _heartbeat_loop(self) -> None:
        """Renew the leases when due; between renewals, look for stops (told by the
        database, or asked every ``stop_check_seconds``). Wakes at least every 0.1 s."""
        while self._idle():
            wait = min(0.1, max(0.0, min(self._next_beat, self._next_check) - self.clock()))
            if self.side.listening:
                told = self.side.told(wait)
                if told:
                    self.check([g for g in self.held() if str(g.job_id) in told])
                    continue
            else:
                time.sleep(wait)
            now = self.clock()
            if now >= self._next_beat:
                self.beat()
            elif now >= self._next_check:
                self.check()

    def _live(self, guards: Sequence[Guard] | None = None) -> list[Guard]:
        return [g for g in (self.held() if guards is None else guards)
                if not g.ending.is_set() and not g.stop.is_set() and not g.deadline_passed()]

    def beat(self) -> None:
        """One heartbeat for every live execution, due now: renew their leases in one
        statement; a job whose row did not match has lost its fence. When the database
        cannot be reached, try again sooner (the watchdog self-fences a job whose lease
        runs out meanwhile)."""
        guards = self._live()
        sent = self.clock()
        if not guards:
            self._next_beat = sent + self.settings.heartbeat
            return
        try:
            renewed = self.side.call(lambda store: store.attempts.heartbeat_many(
                [g.held for g in guards], self.settings.lease_seconds))
        except StoreUnavailable as exc:
            log.warning("heartbeat_failed", jobs=len(guards), error=str(exc))
            self._next_beat = self.clock() + min(self.settings.heartbeat, 1.0)
            return
        except JobfenceError as exc:  # refused: as good as not renewed; the watchdog acts
            log.error("heartbeat_refused", jobs=len(guards), error=str(exc))
            self._next_beat = self.clock() + min(self.settings.heartbeat, 1.0)
            return
        self._next_beat = sent + self.settings.heartbeat
        for g in guards:
            if g.job_id in renewed:
                g.renewed(sent)
            else:
                self._lost(g)

    def check(self, guards: Sequence[Guard] | None = None) -> None:
        """One stop check, for every live execution (or these): does each still hold its
        fence with a live lease? Stops those that do not."""
        every = self.settings.stop_check_seconds
        live = self._live(guards)
        if live:
            try:
                holding = self.side.call(lambda store: store.attempts.holding(
                    [g.held for g in live]))
            except JobfenceError as exc:  # the heartbeat and the watchdog see to that
                log.debug("stop_check_failed", error=str(exc))
                holding = {g.job_id for g in live}
            for g in live:
                if g.job_id not in holding:
                    self._lost(g)
        if guards is None:
            # Told at once where the connection listens: asking is then only the safety net.
            self._next_check = self.clock() + (every * 10 if self.side.listening else every)

    def _lost(self, guard: Guard) -> None:
        if guard.stop.is_set() or guard.ending.is_set():
            return
        claim = guard.claim
        try:
            why = self.side.call(lambda store: store.attempts.fence(claim.job_id,
                                                                    claim.attempt_id))
        except JobfenceError:
            why = None
        guard.fence_lost(why)

    # -- the watchdog thread -----------------------------------------------------------------

    def _watchdog_loop(self) -> None:
        while self._idle():
            now = self.clock()
            wake = now + 0.25
            for g in self.held():
                if not g.stop.is_set() and not g.deadline_passed():
                    wake = min(wake, g.next_deadline())
            with self._cond:
                if not self._closing:
                    self._cond.wait(max(0.0, min(wake - self.clock(), 0.25)))
