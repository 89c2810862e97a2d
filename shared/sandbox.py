"""A job's own code, kept away from the worker's keys (invariant 9).

The ``command`` child gets:

- an environment built from nothing: ``PATH``, the locale and time zone, ``HOME`` and
  ``TMPDIR`` set to its working directory, the job's ``JOBFENCE_JOB_ID``, ``_ATTEMPT_ID``,
  ``_INPUT_DIR``, ``_OUTPUT_DIR``, the names the deployment lists in
  ``JOBFENCE_COMMAND_ENV``, and the spec's own ``env`` — never the database URL, the S3
  keys, or anything else the worker was given;
- when the worker runs as root (a container's default, the demo, the tests): another user,
  ``JOBFENCE_COMMAND_USER`` (``nobody`` unless set), with no supplementary groups. The
  kernel then refuses it the worker's ``/proc/PID/environ`` and memory, and every file only
  root may read; its working directory is handed over to it;
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from jobfence.proctree import DIE_WITH_PARENT, Tail, kill_group, pump

BASE_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ")
"""What a child gets of the worker's own environment whatever the deployment says."""

SAME_USER = "worker"
"""JOBFENCE_COMMAND_USER's value for a child that keeps the worker's user."""

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
    """How a job's child process is started."""

    uid: int | None = None
    """Run the child as this user (and ``gid``), when the worker may switch users."""
    gid: int | None = None
    passthrough: tuple[str, ...] = ()
    """Names of the worker's own variables a child also gets (JOBFENCE_COMMAND_ENV)."""
    socket: Path | None = None
    """The command sidecar's socket (JOBFENCE_COMMAND_SOCKET): children start there."""

    @classmethod
    def configured(cls, user: str, passthrough: Iterable[str] = (),
                   socket: Path | None = None) -> Sandbox:
        """The sandbox for ``JOBFENCE_COMMAND_USER``, ``JOBFENCE_COMMAND_ENV`` and
        ``JOBFENCE_COMMAND_SOCKET``: the user only matters where the child starts as this
        process's own and this process runs as root (another cannot switch; the sidecar
        applies its own), and ``worker`` keeps this process's user."""
        names = tuple(n for n in passthrough if n)
        if socket is not None or user == SAME_USER or os.geteuid() != 0:
            return cls(passthrough=names, socket=socket)
        uid, gid = resolve_user(user)
        return cls(uid=uid, gid=gid, passthrough=names)

    def start(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> Child:
        """Start the child in ``cwd`` (the attempt's directory, handed over to the child's
        user) with exactly ``env``; ChildNotStarted says why it could not."""
        if self.socket is not None:
            from jobfence.sidecar import RemoteChild

            return RemoteChild.start(self.socket, argv, cwd, env)
        return self.start_here(argv, cwd, env)

    def start_here(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str],
                   sink: Callable[[str, bytes], None] | None = None) -> LocalChild:
        """Start the child as this process's own (the worker's, or the command sidecar's,
        which streams its output to ``sink``)."""
        self.hand_over(cwd)
        return LocalChild(argv, cwd, env, self.popen_args(), sink=sink)

    def environment(self, job: Mapping[str, str], spec: Mapping[str, str],
                    workdir: Path) -> dict[str, str]:
        """The child's whole environment (nothing else of the worker's)."""
        env = {k: os.environ[k] for k in (*BASE_ENV, *self.passthrough) if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update({"HOME": str(workdir), "TMPDIR": str(workdir)})
        if self.uid is not None:
            with contextlib.suppress(KeyError):
                name = pwd.getpwuid(self.uid).pw_name
                env.update({"USER": name, "LOGNAME": name})
        env.update(job)
        env.update(spec)
        return env

    def hand_over(self, root: Path) -> None:
        """Give the child's user the attempt's directory and all in it (inputs included)."""
        if self.uid is None or self.gid is None:
            return
        for path in (root, *root.rglob("*")):
            os.lchown(path, self.uid, self.gid)

    def popen_args(self) -> dict[str, Any]:
        """``subprocess.Popen`` arguments that start the child as the sandbox's user."""
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def resolve_user(user: str) -> tuple[int, int]:
    """``name`` or ``uid[:gid]`` → (uid, gid); ValueError when no such user."""
    if user.replace(":", "").isdigit():
        uid, _, gid = user.partition(":")
        return int(uid), int(gid or uid)
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"JOBFENCE_COMMAND_USER: no user named {user!r}") from None
    return entry.pw_uid, entry.pw_gid
