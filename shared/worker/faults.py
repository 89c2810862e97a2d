"""What a guard's tick raised, noted and counted — never a reason for the guard to stop.

A guard (the heartbeat, the stop checks, the watchdog, a job's tree kill, the pump that
drains a child's output, the reader of the command sidecar's channel) keeps a promise for
as long as the worker runs (invariant 15): whatever one of its ticks raises — a connection
lost mid-statement, a byte a job controls that does not decode, an ``OSError`` from /proc, a
plain bug — is logged here with the jobs it concerned (``guard_fault``, level error), counted
by guard, and the guard goes on at its next tick. The counts go to the database with the
heartbeat that follows (``jobfence_worker_guard_faults``, by queue and guard: a counter that
adds up across short-lived pods), and are kept here until a write of them succeeds.

The command sidecar (a second container of the worker's pod, without database access)
counts its own guards' faults the same way and hands them over with the answer that ends
each request (``faults``): the worker adds them to its own (``adopt``), so that they reach
the database with its next heartbeat.

The guards' names are a fixed set (``GUARDS``): a metric label never grows with what a job
does.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from uuid import UUID

from jobfence.logs import get_logger

log = get_logger("jobfence.worker")

GUARDS = ("heartbeat", "stop_check", "watchdog", "tree_kill", "output", "sidecar")
"""Every guard whose faults are counted: the label values of the metric."""

MAX_ADOPTED = 1_000_000
"""The most faults one answer of the command sidecar may hand over for one guard."""


class Faults:
    """The faults of this process's guards: noted as they happen, taken for the database,
    put back when that write failed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: Counter[str] = Counter()
        self.total: Counter[str] = Counter()
        """Every fault noted in this process, by guard (never taken)."""

    def note(self, guard: str, exc: BaseException, jobs: Iterable[UUID] = ()) -> None:
        """A tick of ``guard`` raised ``exc`` while it kept ``jobs``: log and count it.
        Never raises: it is what the guards call when something did."""
        assert guard in GUARDS, guard
        with self._lock:
            self._pending[guard] += 1
            self.total[guard] += 1
            count = self.total[guard]
        with contextlib.suppress(Exception):  # a log not written is no reason to stop
            log.error("guard_fault", guard=guard, error_type=type(exc).__name__,
                      error=repr(exc)[:500], job_ids=[str(j) for j in jobs], faults=count,
                      message="the guard goes on at its next tick")

    def adopt(self, counts: object) -> None:
        """Faults another process of this worker's pod noted (and logged) and handed over:
        counted here as if they were ours. Anything but ``{guard: 1..MAX_ADOPTED}`` is
        ignored — a count is no reason to stop either."""
        if not isinstance(counts, dict):
            return
        valid = {g: n for g, n in counts.items() if g in GUARDS and type(n) is int
                 and 0 < n <= MAX_ADOPTED}
        if valid:
            with self._lock:
                self._pending.update(valid)
                self.total.update(valid)

    def take(self) -> dict[str, int]:
        """The counts not yet written, now owed by the caller (``restore`` if unwritten)."""
        with self._lock:
            taken, self._pending = dict(self._pending), Counter()
        return taken

    def restore(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            self._pending.update(counts)

    def pending(self) -> bool:
        with self._lock:
            return bool(self._pending)


FAULTS = Faults()
"""This process's guard faults (one worker per process)."""
