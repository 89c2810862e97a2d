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
- its space (``jobfence.worker.jobspace``): directories made for it, owned by its user, that the
  worker reaches only through descriptors (``jobfence.fsboundary``);
- in any case a worker process that the kernel marks non-dumpable (``PR_SET_DUMPABLE`` 0):
  a process of the same user without CAP_SYS_PTRACE can neither read its ``environ`` nor
  attach to it.

A child starts here, as the worker's own child (``LocalChild``), or — with
``JOBFENCE_COMMAND_SOCKET`` set, as the shipped worker pods do — in the command sidecar, a
second container of the worker's pod that holds no Secret, no API token and none of the
worker's processes (``jobfence.worker.sidecar``). Either way the action sees one ``Child``
(``jobfence.actions.child``): wait for its exit, kill its process group, ask what it used;
its output goes to the ``ChildOutput`` it was started with. Whatever the child reaches,
the worker role bounds what a leaked worker credential can do.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

from jobfence.actions.child import ChildNotStarted, JobSpace, SpacePaths, Usage
from jobfence.worker import memcg
from jobfence.worker.proctree import (
    DIE_WITH_PARENT,
    TreeMemory,
    child_waited,
    kill_group,
    pump,
    starting_child,
)

BASE_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ")
"""What a child gets of the worker's own environment whatever the deployment says."""

_PR_SET_DUMPABLE = 4


def protect_worker() -> bool:
    """Mark this process non-dumpable: processes of the same user (without CAP_SYS_PTRACE)
    can no longer read its environment or memory. Whether it took (Linux only)."""
    with contextlib.suppress(AttributeError, OSError):
        return bool(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    return False


class LocalChild:
    """A child of this process in a session of its own, its output handed to ``sink`` as
    it comes. Its exit is collected with ``wait4``, which says the CPU time it (and every
    descendant it waited for) used; its peak memory is watched while it runs
    (``TreeMemory``); a SIGKILL while the out-of-memory killer struck in its memory cgroup
    is told apart (``jobfence.worker.memcg``)."""

    def __init__(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str],
                 popen_args: Mapping[str, Any], sink: Callable[[str, bytes], None], *,
                 sample_seconds: float = 0.5) -> None:
        own_rss = TreeMemory.own_rss()  # what the child's image holds until it execs
        self._memcg = memcg.this_process()
        self._oom_before = self._memcg.oom_kills() if self._memcg else None
        try:
            with starting_child() as register:
                self._proc = subprocess.Popen(
                    list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                    preexec_fn=DIE_WITH_PARENT,  # noqa: PLW1509 - a single prctl call, no locks
                    **popen_args)
                register(self._proc.pid)
        except OSError as exc:
            raise ChildNotStarted(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        except (ValueError, UnicodeError) as exc:
            raise ChildNotStarted(f"cannot start {argv[0]!r}: {exc}") from exc
        self.pgid: int | None = self._proc.pid
        self._closed = False
        self._usage: Usage | None = None
        self._peak = TreeMemory(self._proc.pid, sample_seconds, forked_from=own_rss)
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._pumps = [pump(stream, functools.partial(sink, name))
                       for name, stream in (("out", self._proc.stdout),
                                            ("err", self._proc.stderr))]

    @property
    def pid(self) -> int:
        return self._proc.pid

    def wait(self, timeout: float | None) -> int | None:
        """Its exit status, else None after ``timeout`` seconds (None: however long)."""
        if self._proc.returncode is not None:
            return self._proc.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0005
        while True:
            try:
                pid, status, rusage = os.wait4(self._proc.pid, os.WNOHANG)
            except ChildProcessError:  # collected elsewhere: as Popen does, call it 0
                pid, status, rusage = self._proc.pid, 0, None
            if pid:
                self._proc.returncode = os.waitstatus_to_exitcode(status)
                child_waited(self._proc.pid)
                if rusage is not None:
                    oom = self._oom_killed(self._proc.returncode)
                    self._usage = Usage(rusage.ru_utime + rusage.ru_stime,
                                        self._peak.at_exit(rusage.ru_maxrss * 1024), oom,
                                        self._memcg.limit_bytes() if oom and self._memcg
                                        else None)
                return self._proc.returncode
            self._peak.sample()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, 0.05)

    def _oom_killed(self, code: int) -> bool:
        """Killed by SIGKILL (it, or the process its shell waited for: 128 + 9) while the
        out-of-memory killer's count in its cgroup rose since it started."""
        if code not in (-signal.SIGKILL, 128 + signal.SIGKILL) or self._memcg is None \
                or self._oom_before is None:
            return False
        after = self._memcg.oom_kills()
        return after is not None and after > self._oom_before

    def kill(self) -> bool:
        """SIGKILL its group; False once it was closed (its group's id may be another's)."""
        if self._closed:
            return False
        kill_group(self._proc.pid)
        return True

    def close(self) -> None:
        kill_group(self._proc.pid)  # grandchildren left behind by the child die with it
        self.wait(None)
        self._closed = True
        for thread in self._pumps:
            thread.join(timeout=2)

    def ended(self) -> bool:
        return self._closed

    def usage(self) -> Usage | None:
        return self._usage


class Spaces(Protocol):
    """Where one worker's jobs get their spaces and start their children: here
    (``jobfence.worker.jobspace.LocalSpaces``) or in the command sidecar
    (``jobfence.worker.sidecar.link.SidecarSpaces``) — chosen once, where the worker is
    wired (``jobfence.worker.wiring``)."""

    names_user: bool
    """Whether a child's environment names its user (it runs as another)."""

    def space(self, attempt_id: UUID) -> JobSpace:
        """The (unopened) space of one attempt."""
        ...

    def ready(self) -> bool:
        """Whether children can still be started (the command sidecar is still there)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How a job's child processes are started: its spaces, and what of the worker's
    environment a child gets (the ``ChildEnvironment`` an action is handed)."""

    spaces: Spaces
    passthrough: tuple[str, ...] = ()
    """Names of the worker's own variables a child also gets (JOBFENCE_COMMAND_ENV)."""

    def environment(self, job: Mapping[str, str], spec: Mapping[str, str],
                    paths: SpacePaths) -> dict[str, str]:
        """The child's whole environment (nothing else of the worker's)."""
        env = {k: os.environ[k] for k in (*BASE_ENV, *self.passthrough) if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update({"HOME": paths.workdir, "TMPDIR": paths.workdir,
                    "JOBFENCE_INPUT_DIR": paths.inputs, "JOBFENCE_OUTPUT_DIR": paths.outputs})
        if paths.uid != os.geteuid() or self.spaces.names_user:
            with contextlib.suppress(KeyError):
                name = pwd.getpwuid(paths.uid).pw_name
                env.update({"USER": name, "LOGNAME": name})
        env.update(job)
        env.update(spec)
        return env
