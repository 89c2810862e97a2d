"""The child protocol an action drives: a job's child process and the space it runs in,
wherever they are.

The ``command`` action (and a plugin's action that starts processes) sees only what is
here: a ``JobSpace`` to open, fill with inputs, start children in and read outputs from; a
``Child`` to wait for, kill and ask what it used; a ``ChildOutput`` its streams go to (the
tails kept in the database; the worker's own streams them on to its log and to S3:
``jobfence.worker.output``); and ``ChildEnvironment``, which builds a child's whole
environment. Where the child really runs — as the worker's own child, or in
the command sidecar of the worker's pod — is chosen once, where the worker is wired
(``jobfence.worker.sandbox``): nothing here knows.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from jobfence.fsboundary import Listed, Refused


class ChildNotStarted(Exception):
    """The child could not be started (no such program, the sidecar not answering); the
    message says why, for the action's error."""


class ChildLost(Exception):
    """The child's fate cannot be known any more (the command sidecar went away)."""


TAIL_BYTES = 4096
"""How much of a child's stdout and stderr is kept in the database (the end of each)."""

STREAMS = {"out": "stdout", "err": "stderr"}
"""A child's streams, by the short names its output is handed over with."""


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


class ChildOutput:
    """Where a child's stdout and stderr go as they come (``add``, from the threads that
    read them): the tail of each and how much each held, and the moment of the last
    write (the inactivity clock, ``touch``). The worker's own (``jobfence.worker.output``)
    also streams them to its log and to S3."""

    def __init__(self, touch: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tails = {name: Tail() for name in STREAMS}
        self.sizes = dict.fromkeys(STREAMS, 0)
        self.touch = touch
        self.clock = clock
        self.started = clock()

    def add(self, stream: str, chunk: bytes) -> None:
        """``chunk`` was written to ``stream`` (``out`` or ``err``)."""
        self.tails[stream].add(chunk)
        self.sizes[stream] += len(chunk)
        self.touch()

    def tick(self) -> None:
        """Called while the child runs (every poll of its action): a chance to pass on what
        waited long enough."""

    def close(self) -> None:
        """The child is gone and its streams are drained: pass on what is left."""

    def result(self) -> dict[str, Any]:
        """What an action's result says of its output."""
        out: dict[str, Any] = {}
        for short, name in STREAMS.items():
            out[f"{name}_tail"] = self.tails[short].text()
            out[f"{name}_bytes"] = self.sizes[short]
        return out


@dataclass(frozen=True, slots=True)
class Usage:
    """What a child's process tree used: CPU time (user and system, of the child and every
    descendant it waited for) and its peak memory (the most resident at once: of the whole
    tree where it was sampled, never less than its largest single process)."""

    cpu_seconds: float
    peak_memory_bytes: int | None
    """None where it was not seen (a command that ended within a few milliseconds)."""
    oom_killed: bool = False
    """Killed (SIGKILL, of it or of a process it waited for) while the kernel's
    out-of-memory killer struck in its memory cgroup: its container's limit reached."""
    memory_limit_bytes: int | None = None
    """That cgroup's limit, when it was killed so."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu_seconds": round(self.cpu_seconds, 3),
                               "peak_memory_bytes": self.peak_memory_bytes}
        if self.oom_killed:
            out.update(oom_killed=True, memory_limit_bytes=self.memory_limit_bytes)
        return out

    @classmethod
    def reported(cls, said: object) -> Usage | None:
        """What another process reported (``as_dict``'s form); None for anything else."""
        if not isinstance(said, dict):
            return None
        try:
            cpu = float(said["cpu_seconds"])
            peak = None if said.get("peak_memory_bytes") is None \
                else int(said["peak_memory_bytes"])
            limit = None if said.get("memory_limit_bytes") is None \
                else int(said["memory_limit_bytes"])
        except (KeyError, TypeError, ValueError, OverflowError):  # inf, nan: no usage
            return None
        if not 0 <= cpu < 1e9 or any(v is not None and not 0 <= v < 1 << 50
                                     for v in (peak, limit)):
            return None
        oom = said.get("oom_killed") is True
        return cls(cpu, peak, oom, limit if oom else None)


class Child(Protocol):
    """A job's running child process, wherever it runs."""

    pgid: int | None
    """Its process group when it is this process's child (another thread may kill it)."""

    def wait(self, timeout: float) -> int | None:
        """Its exit status once it has exited, else None after ``timeout`` seconds;
        ChildLost when that cannot be known."""
        ...

    def kill(self) -> object:
        """SIGKILL its whole process group (from any thread)."""
        ...

    def close(self) -> None:
        """Kill what is left of it and release it; its output is complete afterwards."""
        ...

    def ended(self) -> bool:
        """Whether it is known to be gone, its process group with it (after ``close``):
        only then may the job run again elsewhere (invariant 12)."""
        ...

    def usage(self) -> Usage | None:
        """What it used, once it has exited (None where that cannot be known)."""
        ...


@dataclass(frozen=True, slots=True)
class SpacePaths:
    """Where a job's children find their space (the names they see; the worker uses them
    for their environment only) and the uid they run as."""

    workdir: str
    inputs: str
    outputs: str
    uid: int


class JobSpace(Protocol):
    """One attempt's space, wherever its children run."""

    def open(self) -> SpacePaths:
        """Make the space (and take the job's user); its paths."""
        ...

    def create_inputs(self, paths: Sequence[str]) -> list[BinaryIO]:
        """New files under ``inputs/``, open for writing, in the order of ``paths``;
        BoundaryError when one cannot be made there."""
        ...

    def list_outputs(self) -> tuple[list[Listed], list[Refused]]:
        """The regular files of the job's under ``outputs/``; what was refused and why."""
        ...

    def open_outputs(self, items: Sequence[Listed]) -> list[BinaryIO | str]:
        """Each listed file open for reading, or why it is not any more."""
        ...

    def read_file(self, name: str, limit: int) -> bytes | None:
        """What the job's children left in the regular file ``name`` at the top of their
        working directory (a note to the worker, such as a snooze's delay), at most
        ``limit`` bytes (4096 at most); None when there is none; BoundaryError saying why
        anything else there is refused (a link, a FIFO, a longer file)."""
        ...

    def start(self, argv: Sequence[str], env: Mapping[str, str],
              sink: Callable[[str, bytes], None]) -> Child:
        """Start a child in the space with exactly ``env``, its output handed to ``sink``
        (stream ``out`` or ``err``, chunk) as it comes; ChildNotStarted says why not."""
        ...

    def close(self) -> None:
        """Kill what is left of the job's processes, remove the space, release the user."""
        ...


class ChildEnvironment(Protocol):
    """Builds a child's whole environment: what the deployment lets through, the job's
    own variables and the spec's ``env`` — never the worker's keys."""

    def environment(self, job: Mapping[str, str], spec: Mapping[str, str],
                    paths: SpacePaths) -> dict[str, str]: ...
