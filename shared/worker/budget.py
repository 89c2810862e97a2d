"""How many more jobs a worker may claim, and why no more when none: ``--max-jobs``,
``--max-seconds``, SIGTERM, a lost command sidecar, failed guards, or a job given back for
want of a free uid. The loop takes places for its claims; an execution takes one at its
terminal write for the job that would follow it in its slot."""

from __future__ import annotations

import threading
import time

from jobfence.worker.execution import Next
from jobfence.worker.sandbox import Spaces


class Budget:
    """How many more jobs this worker may claim, and why no more when none."""

    def __init__(self, max_jobs: int, max_seconds: float | None, spaces: Spaces,
                 guards_failed: threading.Event | None = None) -> None:
        self._left = max_jobs
        self._deadline = None if max_seconds is None else time.monotonic() + max_seconds
        self._spaces = spaces
        self._guards_failed = guards_failed or threading.Event()
        self.no_free_uid = threading.Event()
        """Set when a job was given back for want of a uid: claiming again here would claim
        it (or another) only to give it back."""
        self._lock = threading.Lock()
        self.terminated = threading.Event()

    def why_not(self) -> str | None:
        """Why no job may be claimed now (None: one may)."""
        if self._guards_failed.is_set():
            return "guards_failed"
        if self.terminated.is_set():
            return "sigterm"
        if self.no_free_uid.is_set():
            return "no_free_uid"
        if self._left <= 0:
            return "max_jobs"
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return "max_seconds"
        if not self._spaces.ready():
            return "sidecar_lost"
        return None

    def take(self, n: int) -> int:
        """Take up to ``n`` places; how many were granted."""
        with self._lock:
            if self.why_not() is not None:
                return 0
            granted = min(n, self._left)
            self._left -= granted
            return granted

    def give(self, n: int) -> None:
        """Give back places taken for claims that found no job."""
        with self._lock:
            self._left += n

    def next(self) -> Next:
        """What an execution asks at its terminal write: one place for the job that would
        follow it in its slot."""
        return Next(want=lambda: self.take(1) == 1, unwant=lambda: self.give(1))
