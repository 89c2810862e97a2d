"""The worker's ``Guards``: two threads that keep every execution's ``Guard``
(``jobfence.worker.guard``) honest while its actions run, however many jobs run at once:

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

SIGTERM (an eviction, a drain) is not the job's fault: every job in hand (a claim riding on a
terminal write is guarded as it arrives) is given back in one statement, its attempt not
counted (``worker_interrupt_many``, ``JOBFENCE_MAX_INTERRUPTIONS``).

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
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar
from uuid import UUID

from jobfence.errors import JobfenceError, StoreUnavailable
from jobfence.logs import get_logger
from jobfence.settings import Settings, self_fence_margin
from jobfence.store import Claim, Transition
from jobfence.worker.faults import FAULTS, Faults
from jobfence.worker.guard import Guard, StopReason
from jobfence.worker.side_channel import SideChannel

log = get_logger("jobfence.worker")
T = TypeVar("T")

FAULT_RETRY_SECONDS = 0.1
"""After a heartbeat a fault cut short (not an unreachable database: that one is tried again
within a second), the next goes this soon: a fault must not cost a lease."""

GIVE_BACK_TRIES = 3
"""How many times the give-back (SIGTERM, guards that failed) is tried before the jobs are left
to their leases' end: one statement each, on a connection of its own if the guards' is busy."""

FAULT_PAUSE_SECONDS = 0.05
"""After a step that failed at once, its thread waits this long before going on: a guard
whose every step raises must not spin a core."""


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
        self._closed = threading.Event()  # set by close: ends the watchdog's wait between ticks
        self._terminated = False
        self._threads: list[threading.Thread] = []
        self._next_beat = clock() + settings.heartbeat
        self._next_check = clock() + settings.stop_check_seconds
        self._next_flush = clock()

    # -- executions come and go ------------------------------------------------------------

    def guard(self, claim: Claim) -> Guard:
        """A guard for a claim, kept until ``release`` (the one it has if guarded already).
        After SIGTERM (or once the guards failed) it is stopped at once and its job given
        back (a claim made meanwhile)."""
        with self._cond:
            if (g := self._guards.get(claim.job_id)) and g.held == claim[:2]:
                return g
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
            if idle:  # threads waiting for a first guard; not the watchdog between ticks
                self._cond.notify_all()
        if broken is not None:
            self._broken("heartbeat", broken)
        elif terminated:
            self._give_back([guard], self._reason())
        return guard

    @staticmethod
    def _start(thread: threading.Thread) -> None:  # a test's way to make a start fail
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
        """Stop both threads (before their connections close); unwritten guard faults go now."""
        with self._cond:
            self._closing = True
            self._closed.set()
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
        """A guard thread cannot run: loudly give back every job held and every later claim."""
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
            log.warning("sigterm_released", job_id=str(t.job_id), status=t.status, reason=reason)
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
            self._closed.wait(wait)  # close ends it: a one-job worker exits at once
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
        self._closed.wait(max(0.0, min(wake - self.clock(), 0.25)))
        return healthy


def _done(g: Guard) -> bool:
    """Whether an execution needs no renewal or check: ending, stopped, or stopped now
    because a deadline passed."""
    return g.ending.is_set() or g.stop.is_set() or g.deadline_passed()


def _due(g: Guard) -> float | None:
    """When the watchdog must look at a running execution again (None: stopped, now or
    before)."""
    return None if g.stop.is_set() or g.deadline_passed() else g.next_deadline()
