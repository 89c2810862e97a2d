"""A job's whole process tree ends with its job.

Killing a command's process group misses what left it: a descendant that called
``setsid()`` (a daemon, ``nohup … &`` under some shells) has its own session and group, and
once its parent exits it is re-parented — normally to PID 1, beyond reach. A worker process
marks itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``, Linux): orphaned descendants
are re-parented to the worker instead, so every process a job started stays a descendant
of its worker, and ``kill_descendants`` can end all of them after each action (success,
failure, cancel, fence loss, SIGTERM) and reap them.

Only a process that runs nothing but jobs may do this: the worker's entry point turns it
on, and ``kill_descendants`` does nothing unless it was turned on (a test runner calling
the worker in-process has descendants of its own). On Kubernetes the pod's lifetime bounds
the tree too: the container's init (tini) kills what is left when the worker exits.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1

TAIL_BYTES = 4096
"""How much of a child's stdout and stderr is kept (the end of each)."""


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group; gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL me if my parent dies, even by SIGKILL (Linux).
    Only an async-signal-safe libc call runs here."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    DIE_WITH_PARENT: Callable[[], None] | None = (
        _die_with_parent if sys.platform == "linux" else None)
    """A ``preexec_fn`` for a child that must not outlive the process that started it."""
except (AttributeError, OSError):
    DIE_WITH_PARENT = None


class Tail:
    """The last TAIL_BYTES written to a child's stream."""

    def __init__(self) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0

    def add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._chunks[0]) >= TAIL_BYTES:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        return b"".join(self._chunks)[-TAIL_BYTES:].decode("utf-8", errors="replace")


def pump(stream: IO[bytes], sink: Callable[[bytes], None]) -> threading.Thread:
    """Read ``stream`` to its end on a thread, handing each chunk to ``sink``, so that the
    child's pipe never fills. The stream is closed at its end."""

    def run() -> None:
        with stream:
            for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
                sink(chunk)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


class _State:
    enabled = False


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where unsupported."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return False
    except (AttributeError, OSError):
        return False
    _State.enabled = True
    return True


def descendants(root: int, proc: Path = Path("/proc")) -> list[int]:
    """Every live process below ``root`` (children first-level first), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone while we looked
        # comm (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    frontier = [root]
    while frontier:
        nxt = [c for p in frontier for c in children.get(p, ())]
        found += nxt
        frontier = nxt
    return found


def kill_descendants(*, reap_children: bool, timeout: float = 2.0) -> int:
    """SIGKILL every descendant of this process; how many were killed. With
    ``reap_children``, also collect the ones that were re-parented to it — only from the
    thread that owns the action, once its ``Popen`` has waited: reaping a child a ``Popen``
    still waits for would hide its exit status. A no-op unless ``become_subreaper``
    succeeded."""
    if not _State.enabled or not has_children():
        return 0  # a subreaper without children has no descendants: nothing to scan
    me = os.getpid()
    killed = 0
    deadline = time.monotonic() + timeout
    while True:
        pids = descendants(me)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        if reap_children:
            reap()
        if not [p for p in descendants(me) if not _zombie(p)] or time.monotonic() > deadline:
            if reap_children:
                reap()
            return killed
        time.sleep(0.01)


def has_children() -> bool:
    """Whether this process has any child, live or exited, without reaping one
    (``WNOWAIT``): a few microseconds, where a /proc scan costs milliseconds."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def reap() -> None:
    """Collect every exited child (re-parented orphans leave zombies otherwise)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:].split()[0] in ("Z", "X")
