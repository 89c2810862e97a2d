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

Both threads outlive their faults (invariant 15): whatever a step of a tick raises — for one
job, or for all (a connection lost, a byte a job controls, an ``OSError``, a bug) — is noted
with its jobs and counted (``jobfence.worker.faults``), the other steps and jobs of that
tick still run, and the step is tried again at the next tick. A thread that cannot run at
all — it would not start, or every one of its ticks failed for ``broken_after`` seconds (half
a lease at most: time enough to give the jobs back before their leases end) — makes the
worker fail loudly: ``guards_failed`` is logged, every job in hand is given back at once as on
SIGTERM (its attempt not counted, up to ``JOBFENCE_MAX_INTERRUPTIONS``), every claim made
afterwards too, and the worker claims no more and exits 1.
"""

from __future__ import annotations

import contextlib
import functools
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
from jobfence.worker.faults import FAULTS, Faults
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
    GUARDS_FAILED = "guards_failed"
    """The worker's guards could not run: the job was given back, as on SIGTERM."""


GIVEN_BACK = frozenset({StopReason.SIGTERM, StopReason.GUARDS_FAILED})
"""The stops after which the guards gave the job back: the execution writes nothing more."""

FAULT_RETRY_SECONDS = 0.1
"""After a heartbeat that a fault cut short (not an unreachable database: that one is tried
again within a second), the next one goes this soon: a fault must not cost a lease."""

GIVE_BACK_TRIES = 3
"""How many times the give-back (SIGTERM, or guards that failed) is tried before the jobs are
left to their leases' end: each try is one statement, on a connection of its own if the
guards' is busy."""

FAULT_PAUSE_SECONDS = 0.05
"""After a step that failed at once, its thread waits this long before going on: a guard
whose every step raises must not spin a core."""


class Guard:
    """The lease deadline, the run deadline and the kill switch of one execution."""

    def __init__(self, claim: Claim, settings: Settings,
                 clock: Callable[[], float] = time.monotonic,
                 alone: Callable[[], bool] = lambda: True, faults: Faults = FAULTS) -> None:
        self.claim = claim
        self.faults = faults
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
        self.kill_owed = False
        """A stop's kill raised: the watchdog kills again until one goes through."""
        self.judged_at = now
        """When the watchdog last judged this execution's deadlines."""
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
        group at once, and what of the job's tree left them. The stop holds whatever a kill
        raises (noted; the action's end kills its tree again)."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
            self.stop.set()
            pgids = list(self._pgids)
        self._kill(pgids)
        return True

    def _kill(self, pgids: Sequence[int]) -> None:
        """Kill these groups and the job's tree; a kill that raised is owed, and the
        watchdog tries it again at its next tick (``kill_owed``)."""
        owed = False
        for pgid in pgids:
            try:
                kill_group(pgid)
            except Exception as exc:
                owed = True
                self.faults.note("tree_kill", exc, [self.job_id])
        try:
            self.kill_tree(reap_children=False)  # setsid, daemons
        except Exception as exc:
            owed = True
            self.faults.note("tree_kill", exc, [self.job_id])
        self.kill_owed = owed

    def kill_again(self) -> None:
        """A stopped execution whose kill raised: kill what it still has registered."""
        with self._lock:
            pgids = list(self._pgids)
        self._kill(pgids)

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
                 clock: Callable[[], float] = time.monotonic, *, queue: str | None = None,
                 faults: Faults = FAULTS) -> None:
        self.settings = settings
        self.side = side or SideChannel(settings)
        self.clock = clock
        self.queue = queue or settings.queue
        """The queue whose metrics count this worker's guard faults."""
        self.faults = faults
        self.failed = threading.Event()
        """Set once a guard thread could not run: every job was given back, and the worker
        claims no more (``Budget.why_not``)."""
        margin = self_fence_margin(settings.lease_seconds)
        self.broken_after = max(0.3, min(settings.lease_seconds / 2,
                                         settings.lease_seconds - settings.heartbeat
                                         - 2 * margin))
        """How long a guard thread's every tick may fail before the worker stops trusting
        its guards and gives its jobs back: before the leases a last heartbeat renewed end."""
        self._cond = threading.Condition()
        self._guards: dict[UUID, Guard] = {}
        self._closing = False
        self._terminated = False
        self._threads: list[threading.Thread] = []
        self._next_beat = clock() + settings.heartbeat
        self._next_check = clock() + settings.stop_check_seconds
        self._next_flush = clock()

    # -- executions come and go ------------------------------------------------------------

    def guard(self, claim: Claim) -> Guard:
        """A guard for a new execution, kept from now until ``release``. After SIGTERM
        (or once the guards failed) the guard is stopped at once and its job given back (a
        claim made meanwhile)."""
        guard = Guard(claim, self.settings, self.clock, alone=self._alone, faults=self.faults)
        broken: BaseException | None = None
        with self._cond:
            idle = not self._guards
            self._guards[claim.job_id] = guard
            terminated = self._terminated
            if not self._threads and not terminated:
                if len(self._guards) == 1:
                    self._next_beat = self.clock() + self.settings.heartbeat
                    self._next_check = self.clock() + self.settings.stop_check_seconds
                self._threads = [
                    threading.Thread(target=self._supervised, args=(name, tick), name=name,
                                     daemon=True)
                    for name, tick in (("heartbeat", self._heartbeat_tick),
                                       ("watchdog", self._watchdog_tick))]
                try:
                    for t in self._threads:
                        self._start(t)
                except Exception as exc:  # no thread, no guard: nothing may run unguarded
                    broken = exc
            if idle:  # the threads wait for a first guard; a later one needs no wake-up
                self._cond.notify_all()
        if broken is not None:
            self._broken("heartbeat", broken)
        elif terminated:
            self._give_back([guard], self._reason())
        return guard

    @staticmethod
    def _start(thread: threading.Thread) -> None:
        thread.start()

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
        """Stop both threads; call before the connections they use are closed. The guard
        faults not yet written go now."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for t in self._threads:
            if t is not threading.current_thread() and t.is_alive():
                t.join(timeout=self.settings.heartbeat + 6)
        with contextlib.suppress(Exception):  # noted already; counted where it can be
            self._flush()
        self.side.close_quietly()

    # -- SIGTERM, and guards that cannot run -------------------------------------------------

    def give_back_all(self) -> list[Transition]:
        """The SIGTERM path, run by the shutdown watcher while executions may be blocked in
        their actions: stop every one, kill their trees, and give every job back at once,
        in one statement. Every claim made from now on is given back as it arrives."""
        with self._cond:
            self._terminated = True
            guards = list(self._guards.values())
        return self._give_back(guards, StopReason.SIGTERM)

    def _reason(self) -> StopReason:
        return StopReason.GUARDS_FAILED if self.failed.is_set() else StopReason.SIGTERM

    def _broken(self, name: str, exc: BaseException) -> None:
        """A guard thread cannot run: say so loudly, give every job back at once, and every
        claim made from now on; the worker claims no more and exits 1."""
        self.failed.set()
        with self._cond:
            self._terminated = True
            guards = list(self._guards.values())
        log.error("guards_failed", guard=name, error_type=type(exc).__name__,
                  error=repr(exc)[:500], job_ids=[str(g.job_id) for g in guards],
                  message="a guard of this worker cannot run: every job it holds is given "
                          "back now, and it claims no more")
        self._give_back(guards, StopReason.GUARDS_FAILED)

    def _give_back(self, guards: Sequence[Guard], reason: StopReason) -> list[Transition]:
        for g in guards:
            g.request_stop(reason)
        if not guards:
            return []
        held = [g.held for g in guards]
        why = ("worker received SIGTERM" if reason is StopReason.SIGTERM
               else "the worker's guards failed")
        for left in range(GIVE_BACK_TRIES - 1, -1, -1):
            try:
                back = self.side.call(lambda store: store.attempts.interrupt_many(
                    held, reason=why, max_interruptions=self.settings.max_interruptions),
                    wait=0.1)
                break
            except Exception as exc:  # else the leases end them, and the sweeper then
                log.error("sigterm_release_failed", jobs=len(held), error=repr(exc)[:500],
                          reason=reason.value, tries_left=left)
        else:
            return []
        for t in back:
            log.warning("sigterm_released", job_id=str(t.job_id), status=t.status,
                        reason=reason.value)
        return back

    # -- the threads' supervision ------------------------------------------------------------

    def _idle(self) -> bool:
        """Wait while there is nothing to guard; False once closing."""
        with self._cond:
            while not self._closing and not self._guards:
                self._cond.wait()
                self._next_beat = self.clock() + self.settings.heartbeat
            return not self._closing

    def _supervised(self, name: str, tick: Callable[[], bool]) -> None:
        """Run one guard thread's ``tick`` until closing. Each step of a tick notes its own
        faults; a tick that raised as a whole is noted with every job held and run again.
        The thread gives up — and the worker its jobs (``_broken``) — when its ticks have
        raised for ``broken_after`` seconds in a row, when a tick says it cannot keep its
        promise (False: a job unguarded that long), or on anything outside a tick."""
        failing_since: float | None = None
        try:
            while self._idle():
                try:
                    healthy = tick()
                except Exception as exc:
                    self.faults.note(name, exc, [g.job_id for g in self.held()])
                    now = self.clock()
                    failing_since = now if failing_since is None else failing_since
                    if now - failing_since >= self.broken_after:
                        self._broken(name, RuntimeError(
                            f"every tick of the {name} raised for "
                            f"{now - failing_since:.1f} s, the last: {exc!r}"))
                        return
                    time.sleep(FAULT_PAUSE_SECONDS)
                    continue
                failing_since = None
                if not healthy:
                    self._broken(name, RuntimeError(
                        f"the {name} could not judge a job for {self.broken_after:.1f} s"))
                    return
        except BaseException as exc:
            self._broken(name, exc)

    def _step(self, name: str, fn: Callable[[], T], jobs: Sequence[UUID] = ()) -> \
            tuple[bool, T | None]:
        """One step of a tick: its value, or (noted) nothing when it raised."""
        try:
            return True, fn()
        except Exception as exc:
            self.faults.note(name, exc, jobs or [g.job_id for g in self.held()])
            return False, None

    # -- the heartbeat thread ----------------------------------------------------------------

    def _heartbeat_tick(self) -> bool:
        """Renew the leases when due; between renewals, look for stops (told by the
        database, or asked every ``stop_check_seconds``). Wakes at least every 0.1 s.
        Each step runs whatever the one before it raised: a lease a step could not renew is
        tried again soon, and the watchdog self-fences a job whose lease runs out."""
        wait = min(0.1, max(0.0, min(self._next_beat, self._next_check) - self.clock()))
        if self.side.listening:
            ok, told = self._step("stop_check", lambda: self.side.told(wait))
            if told:
                self.check([g for g in self.held() if str(g.job_id) in told])
                return True
            if not ok:
                time.sleep(FAULT_PAUSE_SECONDS)
        else:
            time.sleep(wait)
        now = self.clock()
        if now >= self._next_beat:
            self.beat()
        elif now >= self._next_check:
            self.check()
        if now >= self._next_flush and self.faults.pending():
            self._next_flush = now + self.settings.heartbeat
            self._step("heartbeat", self._flush)
        return True

    def _flush(self) -> None:
        """Write the guard faults noted so far to the database's metrics; kept for the
        next time when the write fails."""
        counts = self.faults.take()
        if not counts:
            return
        try:
            self.side.call(lambda store: store.job_metrics.guard_faults(self.queue, counts))
        except BaseException:
            self.faults.restore(counts)
            raise

    def _live(self, guards: Sequence[Guard] | None = None) -> tuple[list[Guard], bool]:
        """The executions still to renew or check, and False if a guard's deadline could
        not be judged (that guard is left out of this tick)."""
        live: list[Guard] = []
        ok = True
        for g in self.held() if guards is None else guards:
            fine, done = self._step("watchdog", functools.partial(_done, g), [g.job_id])
            ok = ok and fine
            if fine and not done:
                live.append(g)
        return live, ok

    def beat(self) -> bool:
        """One heartbeat for every live execution, due now: renew their leases in one
        statement; a job whose row did not match has lost its fence. When the database
        cannot be reached, try again sooner (the watchdog self-fences a job whose lease
        runs out meanwhile). False if a step raised."""
        guards, ok = self._live()
        sent = self.clock()
        if not guards:
            self._next_beat = sent + self.settings.heartbeat
            return ok
        try:
            renewed = self.side.call(lambda store: store.attempts.heartbeat_many(
                [g.held for g in guards], self.settings.lease_seconds))
        except StoreUnavailable as exc:
            log.warning("heartbeat_failed", jobs=len(guards), error=str(exc))
            self._next_beat = self.clock() + min(self.settings.heartbeat, 1.0)
            return ok
        except JobfenceError as exc:  # refused: as good as not renewed; the watchdog acts
            log.error("heartbeat_refused", jobs=len(guards), error=str(exc))
            self._next_beat = self.clock() + min(self.settings.heartbeat, 1.0)
            return ok
        except Exception as exc:  # not an answer at all: noted, and tried again at once
            self.faults.note("heartbeat", exc, [g.job_id for g in guards])
            self._next_beat = self.clock() + FAULT_RETRY_SECONDS
            return False
        self._next_beat = sent + self.settings.heartbeat
        for g in guards:
            if g.job_id in renewed:
                fine = self._step("heartbeat", functools.partial(g.renewed, sent),
                                  [g.job_id])[0]
            else:
                fine = self._step("heartbeat", functools.partial(self._lost, g),
                                  [g.job_id])[0]
            ok = ok and fine
        if not ok:  # a job left out of this renewal, or not told of it: the next one soon
            self._next_beat = self.clock() + FAULT_RETRY_SECONDS
        return ok

    def check(self, guards: Sequence[Guard] | None = None) -> bool:
        """One stop check, for every live execution (or these): does each still hold its
        fence with a live lease? Stops those that do not. False if a step raised."""
        every = self.settings.stop_check_seconds
        live, ok = self._live(guards)
        if guards is None:
            # Told at once where the connection listens: asking is then only the safety net.
            self._next_check = self.clock() + (every * 10 if self.side.listening else every)
        if not live:
            return ok
        try:
            holding = self.side.call(lambda store: store.attempts.holding(
                [g.held for g in live]))
        except JobfenceError as exc:  # the heartbeat and the watchdog see to that
            log.debug("stop_check_failed", error=str(exc))
            return ok
        except Exception as exc:
            self.faults.note("stop_check", exc, [g.job_id for g in live])
            return False
        for g in live:
            if g.job_id not in holding:
                ok = self._step("stop_check", functools.partial(self._lost, g),
                                [g.job_id])[0] and ok
        return ok

    def _lost(self, guard: Guard) -> None:
        if guard.stop.is_set() or guard.ending.is_set():
            return
        claim = guard.claim
        try:
            why = self.side.call(lambda store: store.attempts.fence(claim.job_id,
                                                                    claim.attempt_id))
        except Exception:  # the stop matters, not why: it is made without the reason
            why = None
        guard.fence_lost(why)

    # -- the watchdog thread -----------------------------------------------------------------

    def _watchdog_tick(self) -> bool:
        """Stop each execution whose deadline passed, then wait for the next deadline (at
        most 0.25 s). False when a running execution's deadlines could not be judged for
        ``broken_after`` seconds: nothing would stop it at its lease's end."""
        now = self.clock()
        wake = now + 0.25
        healthy = True
        for g in self.held():
            fine, due = self._step("watchdog", functools.partial(_due, g), [g.job_id])
            if fine:
                g.judged_at = now
            elif not g.stop.is_set() and now - g.judged_at >= self.broken_after:
                healthy = False
            if g.kill_owed:
                g.kill_again()
            if due is not None:
                wake = min(wake, due)
        with self._cond:
            if not self._closing:
                self._cond.wait(max(0.0, min(wake - self.clock(), 0.25)))
        return healthy


def _done(g: Guard) -> bool:
    """Whether an execution needs no renewal or check: ending, stopped, or stopped now
    because a deadline passed."""
    return g.ending.is_set() or g.stop.is_set() or g.deadline_passed()


def _due(g: Guard) -> float | None:
    """When the watchdog must look at a running execution again (None: stopped, now or
    before)."""
    return None if g.stop.is_set() or g.deadline_passed() else g.next_deadline()
