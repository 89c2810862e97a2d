"""A pod's containers as processes on this machine: each started through ``enter`` (its own
namespaces, mounts and user), its output appended to one log file, signalled and waited
for by the agent. Started from the agent's main thread only: ``enter`` follows the thread
that forked it into death (``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devtools.cluster.agent.podspec import User

REPO = Path(__file__).resolve().parents[3]


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def runtime_paths() -> list[str]:
    """What a container must reach to run ``jobfence`` from this environment: the Python
    installation, the virtualenv and the work tree (an editable install)."""
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), str(REPO)}
    return sorted(paths)


@dataclass
class Process:
    """One container's process (``kind``: init, sidecar or main)."""

    kind: str
    name: str
    image: str
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    waiting: tuple[str, str] | None = None
    """(reason, message) while it cannot start (ErrImagePull, CreateContainerConfigError)."""
    signalled: set[int] = field(default_factory=set)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None

    @property
    def done(self) -> bool:
        return self.exit_code is not None

    pid_file: Path | None = None

    @property
    def started(self) -> bool:
        """Its container exists: namespaces made, its PID 1 forked (what a runtime's
        "started" means; nothing says the program inside has done anything yet)."""
        return self.done or (self.pid_file is not None and self.pid_file.exists())

    def start(self, *, directory: Path, log: Path, user: User, argv: list[str],
              env: dict[str, str], cwd: str, mounts: list[dict[str, Any]],
              hostname: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        spec = {"agentPid": os.getpid(), "hostname": hostname[:63],
                "scratch": str(directory / f"scratch-{self.name}"),
                "pidFile": str(directory / f"{self.name}.pid"),
                "mounts": mounts, "expose": runtime_paths(),
                "readOnlyRoot": user.read_only_root,
                "noNewPrivileges": user.no_new_privileges,
                "env": env, "argv": argv, "cwd": cwd,
                "uid": user.uid, "gid": user.gid, "groups": list(user.groups)}
        self.pid_file = directory / f"{self.name}.pid"
        spec_file = directory / f"{self.name}.json"
        spec_file.write_text(json.dumps(spec))
        spec_file.chmod(0o600)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "devtools.cluster.agent.enter", str(spec_file)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=REPO,
                env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                start_new_session=True)
        self.started_at = now_iso()
        self.waiting = None

    def poll(self) -> bool:
        """True when it ended just now."""
        if self.proc is None or self.exit_code is not None:
            return False
        code = self.proc.poll()
        if code is None:
            return False
        self.exit_code = 128 - code if code < 0 else code
        self.finished_at = now_iso()
        self.reason = "Completed" if self.exit_code == 0 else "Error"
        return True

    def signal(self, sig: int) -> None:
        """SIGTERM (and the like) reaches the container's PID 1 through ``enter``; SIGKILL
        ends ``enter``, whose death kills the container's whole PID namespace."""
        if self.running and sig not in self.signalled:
            self.signalled.add(sig)
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill_now(self, timeout: float = 5.0) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            self.poll()

    def state(self) -> dict[str, Any]:
        if self.exit_code is not None:
            terminated: dict[str, Any] = {"exitCode": self.exit_code, "reason": self.reason,
                                          "finishedAt": self.finished_at}
            if self.started_at:
                terminated["startedAt"] = self.started_at
            return {"terminated": terminated}
        if self.proc is not None:
            return {"running": {"startedAt": self.started_at}}
        reason, message = self.waiting or ("ContainerCreating", "")
        waiting = {"reason": reason}
        if message:
            waiting["message"] = message
        return {"waiting": waiting}
