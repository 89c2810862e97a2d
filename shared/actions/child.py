"""The child protocol an action drives: a job's child process and the space it runs in,
wherever they are.

The ``command`` action (and a plugin's action that starts processes) sees only what is
here: a ``JobSpace`` to open, fill with inputs, start children in and read outputs from; a
``Child`` to wait for, kill and read the tails of; and ``ChildEnvironment``, which builds a
child's whole environment. Where the child really runs — as the worker's own child, or in
the command sidecar of the worker's pod — is chosen once, where the worker is wired
(``jobfence.worker.sandbox``): nothing here knows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from jobfence.fsboundary import Listed, Refused


class ChildNotStarted(Exception):
    """The child could not be started (no such program, the sidecar not answering); the
    message says why, for the action's error."""


class ChildLost(Exception):
    """The child's fate cannot be known any more (the command sidecar went away)."""


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

    def output(self) -> tuple[str, str]:
        """The tails of its stdout and stderr."""
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

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> Child:
        """Start a child in the space with exactly ``env``; ChildNotStarted says why not."""
        ...

    def close(self) -> None:
        """Kill what is left of the job's processes, remove the space, release the user."""
        ...


class ChildEnvironment(Protocol):
    """Builds a child's whole environment: what the deployment lets through, the job's
    own variables and the spec's ``env`` — never the worker's keys."""

    def environment(self, job: Mapping[str, str], spec: Mapping[str, str],
                    paths: SpacePaths) -> dict[str, str]: ...
