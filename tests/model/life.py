"""A reference model of a job's life: pure Python, no database, written from the product
contract (``../shared/CONTRACT.md``) and docs/REFERENCE.md — never from the SQL — so that the
store can be checked against what the documents promise rather than against itself.

Time is counted in whole *ticks*. A tick is long (the machine that drives the real store
makes it 1,000 s of the database's clock) and the real time a test takes is short beside
it, so "a deadline has passed" is exact: it has when ``now >= deadline``. A delay the
product jitters (a retry's backoff, a snooze of less than a tick) is modelled as "due at the
next tick": long enough that no real time makes it due, short enough that any step of the
clock does.

Where the documents leave a choice to the implementation (which of several ready jobs a
claim takes; whether a resource held only by a stopping attempt whose lease has run out is
free before the sweeper has let it go), the model says which outcomes are allowed and the
driver adopts the one the store chose.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

ACTIVE = ("waiting", "pending", "running")
TERMINAL = ("succeeded", "failed", "cancelled")

Trail = list[tuple[str | None, str]]


@dataclass
class Stopping:
    """A cancelled running attempt whose command may still run (invariant 12): its job keeps
    its resource, is not claimed again, takes its queue's slot and is not retried, until its
    worker confirms the command gone or its lease (``until``) runs out; the sweeper lets the
    resource go after the lease."""

    attempt: str
    until: int
    let_go: bool = False


@dataclass
class Job:
    key: str
    queue: str
    resource: str | None
    actions: int
    outputs: tuple[bool, ...]
    """Which actions write one output file when they succeed."""
    max_attempts: int
    after: tuple[str, ...] = ()
    parent: str | None = None
    is_parent: bool = False
    children: list[str] = field(default_factory=list)
    expires_at: int | None = None
    visible_at: int = 0
    status: str = "pending"
    attempt_count: int = 0
    snoozes: int = 0
    interruptions: int = 0
    attempt: str | None = None
    """The attempt holding the fence (running jobs only)."""
    lease_end: int | None = None
    stopping: Stopping | None = None
    done: dict[int, str] = field(default_factory=dict)
    """The actions that succeeded in this job's current run (since its enqueue or its last
    operator retry), each with the attempt that did it: a later attempt of the run resumes
    after them, and the job succeeds only when every action is here."""
    started: bool = False
    """Claimed at least once since its enqueue: ``expires_in`` cancels only jobs that never
    started."""
    trail: Trail = field(default_factory=list)
    """The audit trail this job must have: (from, to) of every transition, in order."""


@dataclass
class Queue:
    paused: bool = False
    limit: int | None = None


class Refused(Exception):
    """The model refuses the verb; ``why`` holds every reason that applies (the store may
    name any one of them)."""

    def __init__(self, why: set[str]) -> None:
        super().__init__(", ".join(sorted(why)))
        self.why = why


class Life:
    """Every job and queue of one installation, and the verbs that move them."""

    def __init__(self, *, lease: int = 2, max_snoozes: int = 3,
                 max_interruptions: int = 1000) -> None:
        self.now = 0
        self.lease = lease
        self.max_snoozes = max_snoozes
        self.max_interruptions = max_interruptions
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, Queue] = {}
        self._attempts = itertools.count(1)

    # -- reading -----------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        return self.queues.setdefault(name, Queue())

    def live_stopping(self, j: Job) -> bool:
        """Its cancelled attempt may still run: not confirmed gone, lease not over."""
        s = j.stopping
        return s is not None and not s.let_go and self.now < s.until

    def lingering(self, j: Job) -> bool:
        """Its stopping attempt's lease is over but the sweeper has not let it go yet."""
        s = j.stopping
        return s is not None and not s.let_go and self.now >= s.until

    def occupied(self, queue: str) -> int:
        """Slots of ``queue``'s limit in use: running claims and attempts still stopping
        (a cancelled attempt keeps its slot until its command is gone or its lease ends)."""
        return sum(1 for j in self.jobs.values() if j.queue == queue and not j.is_parent
                   and (j.status == "running" or self.live_stopping(j)))

    def resource(self, resource: str | None, *, but: str | None = None) -> str:
        """``busy`` when another job holds ``resource`` (active, or cancelled and still
        stopping), ``free`` when none does, ``either`` when only a stopping attempt whose
        lease has run out holds it (free by the docs, let go by the sweeper's next pass)."""
        if resource is None:
            return "free"
        others = [j for j in self.jobs.values() if j.resource == resource and j.key != but]
        if any(j.status in ACTIVE or self.live_stopping(j) for j in others):
            return "busy"
        return "either" if any(self.lingering(j) for j in others) else "free"

    def why_not_ready(self, j: Job) -> str | None:
        """Why a claim of its queue may not take ``j`` now; None when it may."""
        if j.is_parent:
            return "a parent runs nothing itself"
        if j.status != "pending":
            return f"it is {j.status}"
        if self.now < j.visible_at:
            return "it is not due yet"
        if self.live_stopping(j):
            return "its cancelled attempt is still stopping"
        if any(self.jobs[d].status != "succeeded" for d in j.after):
            return "a dependency has not succeeded"
        q = self.queue(j.queue)
        if q.paused:
            return "its queue is paused"
        if q.limit is not None and self.occupied(j.queue) >= q.limit:
            return f"its queue is at its limit ({q.limit}, stopping attempts counted)"
        return None

    def ready(self, queue: str) -> set[str]:
        return {k for k, j in self.jobs.items()
                if j.queue == queue and self.why_not_ready(j) is None}

    def holds(self, key: str, attempt: str) -> bool:
        """The attempt still holds its job's fence with a live lease (every write after a
        claim is predicated on both)."""
        j = self.jobs[key]
        return (j.status == "running" and j.attempt == attempt
                and j.lease_end is not None and self.now < j.lease_end)

    def todo(self, key: str) -> list[int]:
        """The actions a new attempt runs: those not done in the job's current run."""
        j = self.jobs[key]
        return [i for i in range(j.actions) if i not in j.done]

    def outputs(self, key: str) -> dict[int, str]:
        """The outputs a succeeded job lists: each action's that wrote one, by the attempt
        that did the action in the job's current run."""
        j = self.jobs[key]
        return {i: a for i, a in j.done.items() if j.outputs[i]}

    # -- moving ------------------------------------------------------------------------------

    def _move(self, j: Job, to: str) -> None:
        assert j.status not in TERMINAL or to in ("pending", "waiting"), (j.key, j.status, to)
        j.trail.append((j.status, to))
        j.status = to

    def _end(self, j: Job, to: str) -> None:
        """A terminal transition, and what waited on the job settled (transitively)."""
        self._move(j, to)
        j.attempt = None
        self._settle(j)

    def _settle(self, j: Job) -> None:
        for w in self.jobs.values():
            if w.status != "waiting" or j.key not in w.after:
                continue
            if j.status in ("failed", "cancelled"):
                self._end(w, "failed")
            elif all(self.jobs[d].status == "succeeded" for d in w.after):
                self._move(w, "pending")

    def enqueue(self, key: str, *, queue: str, resource: str | None, actions: int,
                outputs: tuple[bool, ...], max_attempts: int, after: tuple[str, ...] = (),
                delay: int = 0, expires_in: int | None = None) -> Job:
        """A new top-level job (the caller has checked its resource): ``waiting`` when it
        has ``after``, settled at once against dependencies already finished."""
        j = Job(key, queue, resource, actions, outputs, max_attempts, after=after,
                expires_at=None if expires_in is None else self.now + expires_in,
                visible_at=self.now + delay, status="waiting" if after else "pending")
        j.trail.append((None, j.status))
        self.jobs[key] = j
        self.queue(queue)
        if after:
            deps = [self.jobs[d] for d in after]
            if any(d.status in ("failed", "cancelled") for d in deps):
                self._end(j, "failed")
            elif all(d.status == "succeeded" for d in deps):
                self._move(j, "pending")
        return j

    def enqueue_parent(self, key: str, children: list[str], *, queue: str, actions: int,
                       outputs: tuple[bool, ...], max_attempts: int) -> Job:
        """A datum parent: running from the start (never claimed), one pending child per
        input, in its queue."""
        p = Job(key, queue, None, actions, outputs, max_attempts, is_parent=True,
                children=list(children), status="running", visible_at=self.now)
        p.trail.append((None, "running"))
        self.jobs[key] = p
        self.queue(queue)
        for c in children:
            child = Job(c, queue, None, actions, outputs, max_attempts, parent=key,
                        visible_at=self.now)
            child.trail.append((None, "pending"))
            self.jobs[c] = child
        return p

    def claim(self, key: str) -> str:
        """A fresh attempt takes the job's fence, with a lease, spending an attempt."""
        j = self.jobs[key]
        assert self.why_not_ready(j) is None, self.why_not_ready(j)
        attempt = f"a{next(self._attempts)}"
        j.attempt_count += 1
        j.attempt = attempt
        j.lease_end = self.now + self.lease
        j.started = True
        self._move(j, "running")
        return attempt

    def heartbeat(self, key: str, attempt: str) -> bool:
        if not self.holds(key, attempt):
            return False
        self.jobs[key].lease_end = self.now + self.lease
        return True

    def record_action(self, key: str, attempt: str, index: int) -> bool:
        """One action succeeded (not the last of the attempt's)."""
        if not self.holds(key, attempt):
            return False
        self.jobs[key].done[index] = attempt
        return True

    def finish(self, key: str, attempt: str, index: int | None) -> bool:
        """The attempt's last action succeeded (``index``; None: nothing was left to run):
        the job succeeded — every action has succeeded in its current run."""
        if not self.holds(key, attempt):
            return False
        j = self.jobs[key]
        if index is not None:
            j.done[index] = attempt
        assert set(j.done) == set(range(j.actions)), (key, j.done)
        self._end(j, "succeeded")
        return True

    def fail(self, key: str, attempt: str) -> bool:
        """An action failed: back to pending after a backoff while attempts remain, else
        failed."""
        if not self.holds(key, attempt):
            return False
        j = self.jobs[key]
        self._give_back(j, spent=True)
        return True

    def _give_back(self, j: Job, *, spent: bool) -> None:
        j.attempt = None
        if spent and j.attempt_count >= j.max_attempts:
            self._end(j, "failed")
            return
        self._move(j, "pending")
        j.visible_at = self.now + 1

    def snooze(self, key: str, attempt: str) -> bool:
        """An action asked to run again later (less than a tick): the attempt not spent,
        the snooze counted; failed once the job has snoozed ``max_snoozes`` times."""
        if not self.holds(key, attempt):
            return False
        j = self.jobs[key]
        if j.snoozes >= self.max_snoozes:
            self._end(j, "failed")
            return True
        j.snoozes += 1
        j.attempt_count -= 1
        self._give_back(j, spent=False)
        return True

    def interrupt(self, key: str, attempt: str) -> bool:
        """SIGTERM: given back at once, the attempt not spent."""
        if not self.holds(key, attempt):
            return False
        j = self.jobs[key]
        assert j.interruptions < self.max_interruptions
        j.interruptions += 1
        j.attempt_count -= 1
        j.attempt = None
        self._move(j, "pending")
        j.visible_at = self.now
        return True

    def stopped(self, attempt: str) -> str:
        """The attempt's worker confirms its command gone: ``yes`` when that frees a
        stopping attempt, ``no`` when it was not stopping, ``either`` once its lease ran
        out (the lease already bounded it)."""
        for j in self.jobs.values():
            s = j.stopping
            if s is not None and s.attempt == attempt and not s.let_go:
                if self.now < s.until:
                    s.let_go = True
                    return "yes"
                return "either"
        return "no"

    def let_go(self, attempt: str) -> None:
        for j in self.jobs.values():
            if j.stopping is not None and j.stopping.attempt == attempt:
                j.stopping.let_go = True

    def cancel(self, key: str) -> list[str]:
        """Cancel a job (a parent's unfinished children with it); a running attempt stays
        stopping. The jobs cancelled."""
        j = self.jobs[key]
        if j.status in TERMINAL:
            raise Refused({"finished"})
        targets = [j] + [self.jobs[c] for c in j.children
                         if self.jobs[c].status not in TERMINAL]
        for t in targets:
            if t.status == "running" and not t.is_parent:
                assert t.attempt is not None and t.lease_end is not None
                t.stopping = Stopping(t.attempt, t.lease_end)
            self._end(t, "cancelled")
        return [t.key for t in targets]

    def retry_refusals(self, key: str) -> tuple[set[str], bool]:
        """Why an operator's retry is refused (every reason that applies), and whether it
        may also be refused for a resource held only by a lingering stopping attempt."""
        j = self.jobs[key]
        why: set[str] = set()
        if j.status not in ("failed", "cancelled"):
            why.add("not_failed_or_cancelled")
        if j.is_parent:
            why.add("parent")
        if j.parent is not None and self.jobs[j.parent].status != "running":
            why.add("parent_not_running")
        if self.live_stopping(j):
            why.add("stopping")
        held = self.resource(j.resource, but=key)
        if held == "busy":
            why.add("resource_busy")
        return why, held == "either"

    def retry(self, key: str) -> set[str]:
        """An operator's retry: a new run — attempts from zero, nothing done yet, and no
        expiry (the docs leave it open; the store drops ``expires_at``, and an operator who
        asks a job to run again does not want it cancelled unstarted at once). A job
        with ``after`` waits for its dependencies as an enqueue does: pending once they all
        succeeded, else waiting (it may run only after them all). The statuses the job may
        be in right after it (a dependency that already failed fails it at once, or at
        export-finalize's next pass)."""
        j = self.jobs[key]
        j.attempt_count = 0
        j.snoozes = 0
        j.interruptions = 0
        j.done = {}
        j.visible_at = self.now
        j.expires_at = None  # asked to run again: the enqueue's expires_in is spent
        if not j.after:
            self._move(j, "pending")
            return {"pending"}
        self._move(j, "waiting")
        deps = [self.jobs[d] for d in j.after]
        if all(d.status == "succeeded" for d in deps):
            self._move(j, "pending")
            return {"pending"}
        if any(d.status in ("failed", "cancelled") for d in deps):
            return {"waiting", "failed"}
        return {"waiting"}

    def settle_now(self, key: str) -> None:
        """A waiting job whose dependency already failed is failed (the store chose to do
        it at once)."""
        j = self.jobs[key]
        assert j.status == "waiting"
        self._end(j, "failed")

    # -- the periodic passes -------------------------------------------------------------------

    def advance(self, ticks: int) -> None:
        self.now += ticks

    def sweep(self) -> list[str]:
        """Sweeper: expired leases → fence rotated, back to pending after a backoff or
        failed with attempts spent; then stopping attempts past their lease let go. The
        parents to finalize (their last child failed here)."""
        ended: list[str] = []
        for j in list(self.jobs.values()):
            if (j.status == "running" and not j.is_parent and j.lease_end is not None
                    and self.now >= j.lease_end):
                self._give_back(j, spent=True)
                if j.status == "failed" and j.parent:
                    ended.append(j.parent)
        for j in self.jobs.values():
            if self.lingering(j):
                assert j.stopping is not None
                j.stopping.let_go = True
        return ended

    def expire(self) -> list[str]:
        """Lifecycle: waiting or pending jobs past ``expires_in`` that never started are
        cancelled "expired before start"."""
        gone = [j for j in self.jobs.values() if j.status in ("waiting", "pending")
                and j.expires_at is not None and self.now >= j.expires_at and not j.started]
        for j in gone:  # all of them expire, those waiting on each other too
            self._move(j, "cancelled")
            j.attempt = None
        for j in gone:
            self._settle(j)
        return [j.key for j in gone]

    def finalize(self, parent: str) -> bool:
        """A running parent whose children are all terminal: succeeded when every child
        did, else failed."""
        p = self.jobs[parent]
        kids = [self.jobs[c] for c in p.children]
        if p.status != "running" or any(k.status not in TERMINAL for k in kids):
            return False
        self._end(p, "succeeded" if all(k.status == "succeeded" for k in kids) else "failed")
        return True

    def export_finalize(self) -> None:
        """Every parent ready is finalized; every waiting job whose dependencies have all
        finished is released or failed."""
        for p in [j for j in self.jobs.values() if j.is_parent]:
            self.finalize(p.key)
        for w in list(self.jobs.values()):
            if w.status != "waiting" or not w.after:
                continue
            deps = [self.jobs[d] for d in w.after]
            if any(d.status in ("failed", "cancelled") for d in deps):
                self._end(w, "failed")
            elif all(d.status == "succeeded" for d in deps):
                self._move(w, "pending")
