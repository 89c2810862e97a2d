"""A job's own code, kept away from the worker's keys (invariant 9) and from other jobs.

The ``command`` child gets:

- an environment built from nothing: ``PATH``, the locale and time zone, ``HOME`` and
  ``TMPDIR`` set to its working directory, the job's ``JOBFENCE_JOB_ID``, ``_ATTEMPT_ID``,
  ``_INPUT_DIR``, ``_OUTPUT_DIR``, the names the deployment lists in
  ``JOBFENCE_COMMAND_ENV``, and the spec's own ``env`` — never the database URL, the S3
  keys, or anything else the worker was given;
- when the worker runs as root (the demo, a machine of its own): a uid of its own for as
  long as its job runs, or the fixed ``JOBFENCE_COMMAND_USER`` (``jobfence.jobuids``), with
  no supplementary groups. The kernel then refuses it the worker's ``/proc/PID/environ``
  and memory, other jobs' processes and directories, and every file only root may read;
- its space (``jobfence.jobspace``): directories made for it, owned by its user, that the
  worker reaches only through descriptors (``jobfence.fsboundary``);
- in any case a worker process that the kernel marks non-dumpable (``PR_SET_DUMPABLE`` 0):
  a process of the same user without CAP_SYS_PTRACE can neither read its ``environ`` nor
  attach to it.

A child starts here, as the worker's own child (``LocalChild``), or — with
``JOBFENCE_COMMAND_SOCKET`` set, as the shipped worker pods do — in the command sidecar, a
second container of the worker's pod that holds no Secret, no API token and none of the
worker's processes (``jobfence.sidecar``). Either way the action sees one ``Child``: wait
for its exit, kill its process group, read the tails of its output. Whatever the child
reaches, the worker role bounds what a leaked worker credential can do.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import pwd
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from jobfence.jobuids import DEFAULT_UIDS, SameUser, Users, users_for
from jobfence.proctree import DIE_WITH_PARENT, Tail, kill_group, pump

if TYPE_CHECKING:
    from jobfence.jobspace import JobSpace, SpacePaths
    from jobfence.sidecar_worker import RunnerLink

BASE_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ")
"""What a child gets of the worker's own environment whatever the deployment says."""

_PR_SET_DUMPABLE = 4


def protect_worker() -> bool:
    """Mark this process non-dumpable: processes of the same user (without CAP_SYS_PTRACE)
    can no longer read its environment or memory. Whether it took (Linux only)."""
    with contextlib.suppress(AttributeError, OSError):
        return bool(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    return False


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


class LocalChild:
    """A child of this process in a session of its own. Its output goes to ``sink`` (the
    command sidecar streams it), else to tails kept here."""

    def __init__(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str],
                 popen_args: Mapping[str, Any],
                 sink: Callable[[str, bytes], None] | None = None) -> None:
        try:
            self._proc = subprocess.Popen(
                list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=DIE_WITH_PARENT,  # noqa: PLW1509 - a single prctl call, no locks
                **popen_args)
        except OSError as exc:
            raise ChildNotStarted(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        except (ValueError, UnicodeError) as exc:
            raise ChildNotStarted(f"cannot start {argv[0]!r}: {exc}") from exc
        self.pgid: int | None = self._proc.pid
        self._closed = False
        self._tails = {"out": Tail(), "err": Tail()}
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._pumps = [pump(stream, self._tails[name].add if sink is None
                            else functools.partial(sink, name))
                       for name, stream in (("out", self._proc.stdout),
                                            ("err", self._proc.stderr))]

    @property
    def pid(self) -> int:
        return self._proc.pid

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> bool:
        """SIGKILL its group; False once it was closed (its group's id may be another's)."""
        if self._closed:
            return False
        kill_group(self._proc.pid)
        return True

    def close(self) -> None:
        kill_group(self._proc.pid)  # grandchildren left behind by the child die with it
        self._proc.wait()
        self._closed = True
        for thread in self._pumps:
            thread.join(timeout=2)

    def ended(self) -> bool:
        return self._closed

    def output(self) -> tuple[str, str]:
        return self._tails["out"].text(), self._tails["err"].text()


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How a job's child processes are started: in what space, as whom, with what of the
    worker's environment."""

    users: Users = field(default_factory=SameUser)
    """Who a child runs as where it starts as this process's own (jobfence.jobuids)."""
    passthrough: tuple[str, ...] = ()
    """Names of the worker's own variables a child also gets (JOBFENCE_COMMAND_ENV)."""
    sidecar: RunnerLink | None = None
    """The command sidecar (JOBFENCE_COMMAND_SOCKET): children start there."""

    @classmethod
    def configured(cls, user: str | None, uids: str = DEFAULT_UIDS,
                   passthrough: Iterable[str] = (), socket: Path | None = None,
                   runner_uid: int | None = None) -> Sandbox:
        """The sandbox for ``JOBFENCE_COMMAND_USER``, ``_UIDS``, ``_ENV``, ``_SOCKET`` and
        ``_RUNNER_UID``. With a socket, the command sidecar chooses the user (its own
        settings); else a root worker gives each job a uid of its own unless a fixed user is
        set, and another keeps its own. ValueError when a setting is wrong."""
        names = tuple(n for n in passthrough if n)
        if socket is not None:
            from jobfence.sidecar_worker import RunnerLink

            return cls(passthrough=names, sidecar=RunnerLink(socket, runner_uid))
        return cls(users=users_for(user, uids), passthrough=names)

    def space(self, attempt_id: UUID) -> JobSpace:
        """The (unopened) space of one attempt."""
        if self.sidecar is not None:
            from jobfence.sidecar_worker import RemoteSpace

            return RemoteSpace(self.sidecar, attempt_id)
        from jobfence.jobspace import LocalSpace

        return LocalSpace(Path(tempfile.gettempdir()), attempt_id, self.users)

    def ready(self) -> bool:
        """Whether children can still be started (the command sidecar is still there)."""
        return self.sidecar is None or self.sidecar.usable()

    def close(self) -> None:
        if self.sidecar is not None:
            self.sidecar.close()

    def environment(self, job: Mapping[str, str], spec: Mapping[str, str],
                    paths: SpacePaths) -> dict[str, str]:
        """The child's whole environment (nothing else of the worker's)."""
        env = {k: os.environ[k] for k in (*BASE_ENV, *self.passthrough) if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update({"HOME": paths.workdir, "TMPDIR": paths.workdir,
                    "JOBFENCE_INPUT_DIR": paths.inputs, "JOBFENCE_OUTPUT_DIR": paths.outputs})
        if paths.uid != os.geteuid() or self.sidecar is not None:
            with contextlib.suppress(KeyError):
                name = pwd.getpwuid(paths.uid).pw_name
                env.update({"USER": name, "LOGNAME": name})
        env.update(job)
        env.update(spec)
        return env
