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

On Kubernetes the worker's pod runs as a non-root user, and the child shares that user: its
own environment and the worker's process are closed to it as above, but the worker's
parents (the container's init) and files the worker may read are not. A deployment that
needs more runs the command in a second container that holds no Secret (see
docs/REFERENCE.md, "A job's code and the keys"); whatever the child reaches, the worker
role bounds what a leaked worker credential can do.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How a job's child process is started."""

    uid: int | None = None
    """Run the child as this user (and ``gid``), when the worker may switch users."""
    gid: int | None = None
    passthrough: tuple[str, ...] = ()
    """Names of the worker's own variables a child also gets (JOBFENCE_COMMAND_ENV)."""

    @classmethod
    def configured(cls, user: str, passthrough: Iterable[str] = ()) -> Sandbox:
        """The sandbox for ``JOBFENCE_COMMAND_USER`` and ``JOBFENCE_COMMAND_ENV``: the user
        only matters to a worker running as root (another cannot switch), and ``""`` keeps
        the worker's own with ``worker``."""
        names = tuple(n for n in passthrough if n)
        if user == SAME_USER or os.geteuid() != 0:
            return cls(passthrough=names)
        uid, gid = resolve_user(user)
        return cls(uid=uid, gid=gid, passthrough=names)

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
