"""One execution's guard: its lease deadline, its run deadline and its kill switch.

Each execution a worker runs has a ``Guard``; the worker's ``Guards``
(``jobfence.worker.guard_threads``) keep them all with two threads. A stop is one of
``StopReason``: ``fence_lost`` (logged as ``writeback_stale_attempt``), ``lease_expired``,
``timed_out``, ``inactive``, ``sigterm``, ``guards_failed``. Stopping means: set the guard's
``stop`` (actions wait on it), SIGKILL every process group the action registered and every
other process of that job's tree (``jobfence.worker.proctree``), and from then on write
nothing — except the SIGTERM, timeout and inactivity paths, which give the job back with a
fenced write.

The local deadline is measured on the monotonic clock from *before* each successful
heartbeat (or the claim) was sent, so it always falls before the database's own deadline;
the database's ``visible_at > clock_timestamp()`` predicate backs it up.
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

from jobfence.logs import get_logger
from jobfence.settings import Settings, self_fence_margin
from jobfence.store import Claim
from jobfence.store.types import Fence
from jobfence.worker.faults import FAULTS, Faults
from jobfence.worker.proctree import Tree, kill_descendants, kill_group

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
