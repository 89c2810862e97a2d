"""A job's whole process tree ends with its job.

Killing a command's process group misses what left it: a descendant that called
``setsid()`` (a daemon, ``nohup … &`` under some shells) has its own session and group, and
once its parent exits it is re-parented — normally to PID 1, beyond reach. A worker process
marks itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``, Linux): orphaned descendants
are re-parented to the worker instead, so every process a job started stays a descendant
of its worker, and ``kill_descendants`` can end them after each action (success, failure,
cancel, fence loss, SIGTERM) and reap them.

A worker running many jobs at once ends one job's tree only (``Tree``): the descendants in
the sessions its children were started in (each child starts a session of its own), and
those started with its ``JOBFENCE_ATTEMPT_ID`` in their environment. One that left both
(``setsid`` with a scrubbed environment) cannot be told apart from another job's: it is
ended with the next job that ends while no other runs, and with the worker. Where each job
runs as a uid of its own (a root worker, ``jobfence.jobuids``), its uid ends all of it.
Reaping collects only what no ``Popen`` still waits for (``starting_child``).

Only a process that runs nothing but jobs may do this: the worker's entry point turns it
on, and ``kill_descendants`` does nothing unless it was turned on (a test runner calling
the worker in-process has descendants of its own). On Kubernetes the pod's lifetime bounds
the tree too: the container's init (tini) kills what is left when the worker exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, ClassVar, NamedTuple

PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1

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
    return [p.pid for p in _below(root, proc)]


class _Proc(NamedTuple):
    pid: int
    ppid: int
    pgrp: int
    session: int
    state: str


def _stat(pid: int | str, proc: Path = Path("/proc")) -> _Proc | None:
    """One process's line of /proc, or None when it is gone or cannot be read. Its name
    (``comm``, field 2) is the process's to choose — any bytes but NUL, spaces and
    parentheses included, or a non-ASCII name the kernel cut mid-character — so the line
    is read as bytes and parsed after the last ``)``, and the name is never decoded."""
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None  # gone while we looked
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return _Proc(int(pid), int(fields[1]), int(fields[2]), int(fields[3]),
                     fields[0].decode("ascii"))
    except (ValueError, IndexError):  # not a line the kernel writes: not a process to us
        return None


def _below(root: int, proc: Path = Path("/proc")) -> list[_Proc]:
    children: dict[int, list[_Proc]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (p := _stat(entry.name, proc)) is not None:
            children.setdefault(p.ppid, []).append(p)
    found: list[_Proc] = []
    frontier = [root]
    while frontier:
        nxt = [c for p in frontier for c in children.get(p, ())]
        found += nxt
        frontier = [c.pid for c in nxt]
    return found


def _marked(pid: int, marker: bytes) -> bool:
    """Whether the process was started with ``marker`` (NAME=VALUE) in its environment."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return marker in environ.split(b"\0")


class _Children:
    """The pids of the children a ``Popen`` of this process still waits for: a reaper must
    leave them alone, or the ``Popen`` would read a stolen exit status as 0. Popen and
    registration happen under ``lock``, and so does reaping."""

    lock = threading.RLock()
    waited: ClassVar[set[int]] = set()


@contextlib.contextmanager
def starting_child() -> Iterator[Callable[[int], None]]:
    """Around starting a child that a ``Popen`` will wait for: the yielded function
    registers its pid before any reaper may look (``child_waited`` unregisters it)."""
    with _Children.lock:
        yield _Children.waited.add


def child_waited(pid: int) -> None:
    """The child's ``Popen`` has its exit status: a reaper may collect it from now on."""
    with _Children.lock:
        _Children.waited.discard(pid)


class Tree(NamedTuple):
    """What of this process's descendants belongs to one job: the sessions (and process
    groups) its children were started in, and the ``NAME=VALUE`` its children's environment
    carries. A descendant that left both (``setsid`` and a scrubbed environment) is the
    job's only while no other job runs here; a job of its own uid is ended by its uid
    (``jobfence.jobuids``)."""

    sessions: frozenset[int] = frozenset()
    marker: bytes | None = None


def kill_descendants(*, reap_children: bool, timeout: float = 2.0,
                     tree: Tree | None = None,
                     alone: Callable[[], bool] | None = None) -> int:
    """SIGKILL every descendant of this process — only those of ``tree`` unless its job
    runs ``alone`` (no other job here, no other child a ``Popen`` waits for: judged while
    no child can start) — and how many were killed. With ``reap_children``, also collect
    the exited ones that no ``Popen`` waits for (orphans re-parented here). A no-op unless
    ``become_subreaper`` succeeded."""
    if not _State.enabled or not has_children():
        return 0  # a subreaper without children has no descendants: nothing to scan
    if tree is None:
        return _kill(None, reap_children, timeout)
    with _Children.lock:  # no child starts while this is judged (and, alone, killed)
        if alone is not None and alone() and not _Children.waited:
            return _kill(None, reap_children, timeout)
    return _kill(tree, reap_children, timeout)


def _kill(tree: Tree | None, reap_children: bool, timeout: float) -> int:
    me = os.getpid()
    killed = 0
    deadline = time.monotonic() + timeout

    def ours(p: _Proc) -> bool:
        if tree is None:
            return True
        return (p.session in tree.sessions or p.pgrp in tree.sessions
                or (tree.marker is not None and _marked(p.pid, tree.marker)))

    while True:
        doomed = [p for p in _below(me) if p.state not in ("Z", "X") and ours(p)]
        for p in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, signal.SIGKILL)
                killed += 1
        if reap_children:
            reap()
        if not doomed or time.monotonic() > deadline:
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
    """Collect every exited child that no ``Popen`` waits for (re-parented orphans leave
    zombies otherwise)."""
    me = os.getpid()
    with _Children.lock:
        for p in _below_one(me):
            if p.state == "Z" and p.pid not in _Children.waited:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p.pid, os.WNOHANG)


_PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(root: int) -> int:
    """The resident memory (bytes) of ``root`` and every live descendant together, read
    from /proc (each process's children list, so only the tree is read); 0 once gone."""
    total, frontier, seen = 0, [root], set()
    while frontier:
        pid = frontier.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
            for task in Path(f"/proc/{pid}/task").iterdir():
                frontier += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue  # gone while we looked
    return total


class TreeMemory:
    """The peak resident memory of a child and its descendants, watched while it runs:

    - every poll (at most every HWM_SECONDS), the child's own high-water mark (``VmHWM``)
      once it has exec'd its program — before that it is a copy of this process, whose
      pages it shares;
    - every ``every`` seconds (0: never), the whole tree's resident memory together;
    - at its exit, the largest ``ru_maxrss`` of it and the descendants it waited for, where
      that is larger than the image it was forked from (the kernel counts that image in
      the child's own maximum, so a smaller one says nothing).
    """

    HWM_SECONDS = 0.02

    def __init__(self, root: int, every: float, *, forked_from: int) -> None:
        self.root = root
        self.every = every
        self.forked_from = forked_from
        self.peak = 0
        now = time.monotonic()
        self._next_hwm = now
        self._next_tree = now + every
        self._mine = _read(Path("/proc/self/cmdline"))
        self._execd = False

    @staticmethod
    def own_rss() -> int:
        try:
            return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return 0

    def sample(self) -> None:
        if self.every <= 0:
            return
        now = time.monotonic()
        if now >= self._next_hwm:
            self._next_hwm = now + self.HWM_SECONDS
            self.peak = max(self.peak, self._root_hwm())
        if now >= self._next_tree:
            self._next_tree = now + self.every
            self.peak = max(self.peak, tree_rss(self.root))

    def at_exit(self, maxrss: int) -> int | None:
        """The peak, given the largest ``ru_maxrss`` of the tree at its exit; None when
        nothing was seen (a child that ended before its first poll)."""
        return max(self.peak, maxrss if maxrss > self.forked_from * 1.1 else 0) or None

    def _root_hwm(self) -> int:
        if not self._execd:
            if _read(Path(f"/proc/{self.root}/cmdline")) in (self._mine, b""):
                return 0  # not exec'd yet (or gone): its numbers are this process's
            self._execd = True
        try:
            for line in Path(f"/proc/{self.root}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return 0


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _below_one(root: int) -> list[_Proc]:
    """The children of ``root`` (from its task's children list where the kernel keeps one,
    else a /proc scan)."""
    listed = Path(f"/proc/{root}/task/{root}/children")
    try:
        pids = listed.read_text().split()
    except OSError:
        return [p for p in _below(root) if p.ppid == root]
    return [p for pid in pids if (p := _stat(pid)) is not None]
