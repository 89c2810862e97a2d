"""A job's space: one attempt's directories and the user its children run as.

Each attempt gets ``jobfence-ATTEMPT_ID/`` (its children's working directory, ``HOME`` and
``TMPDIR``) with ``inputs/`` and ``outputs/`` in it, all owned by the job's user
(``jobfence.jobuids``) and closed to everyone else (0700). Whoever starts the children makes
them and keeps their descriptors: the worker itself (``LocalSpace``), or the command
sidecar on the worker's behalf (``jobfence.worker.sidecar.link.SidecarSpace``, which the sidecar
serves with a ``LocalSpace`` of its own). Either way every access after a child may have
run goes through those descriptors (``jobfence.fsboundary``):

- inputs are written once per attempt, before its first child starts, into files created
  anew under the ``inputs/`` descriptor (later actions see what earlier ones left);
- outputs are listed from the ``outputs/`` descriptor — if the job moved or replaced that
  directory, nothing is uploaded and the result says so — and each accepted file is opened
  again through descriptors and checked to be the inode that was listed;
- a note the children leave the worker at the top of their working directory (a snooze's
  delay) is read through the working directory's descriptor: a regular file of the job's,
  a few bytes long, or nothing is read;
- the space is removed through descriptors, after every process of the job's own uid is
  killed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO
from uuid import UUID

from jobfence.actions.child import SpacePaths
from jobfence.fsboundary import (
    DIR_FLAGS,
    BoundaryError,
    Listed,
    Refused,
    create_file,
    list_files,
    make_dir,
    open_listed,
    read_small,
    remove_dir,
    remove_owned,
    same_entry,
)
from jobfence.jobuids import JobUser, Users
from jobfence.worker.sandbox import LocalChild

OUTPUTS_MOVED = Refused(".", "the output directory was moved or replaced: nothing in it is "
                             "uploaded")


class LocalSpace:
    """A space this process makes, under ``base`` (a directory the job cannot write: the
    system's temporary directory, or the command sidecar's scratch volume)."""

    def __init__(self, base: Path, attempt_id: UUID | str, users: Users, *,
                 sweep_base: bool = False, sample_seconds: float = 0.5) -> None:
        self.base = base
        self.sample_seconds = sample_seconds
        """How often a child's tree memory is sampled (``LocalChild``)."""
        self.name = f"jobfence-{UUID(str(attempt_id))}"
        self.users = users
        self.sweep_base = sweep_base
        """Remove whatever the job's user left in ``base`` when the space closes (the
        command sidecar's own scratch volume, whose children share its uid)."""
        self.user: JobUser | None = None
        self.paths: SpacePaths | None = None
        self._fds: dict[str, int] = {}

    def open(self) -> SpacePaths:
        if self.paths is not None:
            return self.paths
        user = self.users.take()
        self.user = user
        try:
            self._fds["base"] = os.open(self.base, DIR_FLAGS)
            self._fds["root"] = make_dir(self._fds["base"], self.name, 0o700, user.owner)
            for sub in ("inputs", "outputs"):
                self._fds[sub] = make_dir(self._fds["root"], sub, 0o700, user.owner)
        except BaseException:
            self.close()
            raise
        root = self.base / self.name
        self.paths = SpacePaths(str(root), str(root / "inputs"), str(root / "outputs"),
                                user.effective_uid)
        return self.paths

    def _opened(self) -> tuple[JobUser, SpacePaths]:
        if self.user is None or self.paths is None:
            raise BoundaryError("the job's space is not open")
        return self.user, self.paths

    def create_inputs(self, paths: Sequence[str]) -> list[BinaryIO]:
        user, _ = self._opened()
        if not same_entry(self._fds["root"], "inputs", self._fds["inputs"]):
            raise BoundaryError("the input directory was moved or replaced")
        made: list[BinaryIO] = []
        try:
            for rel in paths:
                made.append(create_file(self._fds["inputs"], rel, 0o644, user.owner))
        except BaseException:
            for f in made:
                f.close()
            raise
        return made

    def list_outputs(self) -> tuple[list[Listed], list[Refused]]:
        _, paths = self._opened()
        if not same_entry(self._fds["root"], "outputs", self._fds["outputs"]):
            return [], [OUTPUTS_MOVED]
        return list_files(self._fds["outputs"], paths.uid)

    def open_outputs(self, items: Sequence[Listed]) -> list[BinaryIO | str]:
        _, paths = self._opened()
        return [open_listed(self._fds["outputs"], item, paths.uid) for item in items]

    def read_file(self, name: str, limit: int) -> bytes | None:
        _, paths = self._opened()
        return read_small(self._fds["root"], name, paths.uid, limit)

    def start(self, argv: Sequence[str], env: Mapping[str, str],
              sink: Callable[[str, bytes], None]) -> LocalChild:
        user, paths = self._opened()
        return LocalChild(argv, Path(paths.workdir), env, user.popen_args(), sink,
                          sample_seconds=self.sample_seconds)

    def close(self) -> None:
        user, self.user = self.user, None

        def remove() -> None:  # after the job's own processes are gone, before its uid is
            if "root" in self._fds:
                remove_dir(self._fds["base"], self.name, self._fds["root"])
            if user is not None and self.sweep_base and "base" in self._fds \
                    and user.effective_uid == os.geteuid() != 0:
                remove_owned(self._fds["base"], user.effective_uid)

        try:
            if user is not None:
                user.release(then=remove)
            else:
                remove()
        finally:
            for fd in self._fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
            self.paths = None


class LocalSpaces:
    """Jobs' spaces made by the worker itself, under the system's temporary directory, their
    children the worker's own (the ``Spaces`` of ``jobfence.worker.sandbox``)."""

    names_user = False

    def __init__(self, users: Users, base: Path | None = None,
                 sample_seconds: float = 0.5) -> None:
        self.users = users
        self.base = base or Path(tempfile.gettempdir())
        self.sample_seconds = sample_seconds

    def space(self, attempt_id: UUID) -> LocalSpace:
        return LocalSpace(self.base, attempt_id, self.users,
                          sample_seconds=self.sample_seconds)

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        pass
