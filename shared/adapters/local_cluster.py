"""The cluster port over worker processes on this machine (the demo's stand-in for
Kubernetes). A "pod" is a running ``jobfence worker`` process of this installation — one
started with ``JOBFENCE_INSTALLATION`` set to it in its environment, as the local platform
starts them; its name is the worker id such a process claims under,
``local:INSTALLATION:HOST:PID``. Any other process, a worker of another installation or one
started by hand, is never listed, so never judged and never signalled. A process that has
exited but not been reaped yet (a zombie) is a pod in phase ``Failed``; one that is gone is
missing.

Its start time is part of the pod: when a PID is reused, the new process started after the
claim, so the claim is not its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from jobfence.cluster import ClusterError, Identity, Pod, local_claimer_pattern

PAGE = 500


def is_worker(argv: Sequence[str]) -> bool:
    """``jobfence worker ...`` or ``python -m jobfence.functions.cli worker ...`` or
    ``python -m jobfence.functions.worker``."""
    if "jobfence.functions.worker" in argv:
        return True
    for i, arg in enumerate(argv):
        if arg == "worker" and any(a == "jobfence.functions.cli"
                                   or os.path.basename(a) == "jobfence" for a in argv[:i]):
            return True
    return False


class LocalCluster:
    def __init__(self, installation: str, host: str | None = None,
                 proc: Path = Path("/proc")) -> None:
        self.installation = installation
        self.host = host or socket.gethostname()
        self.proc = proc
        self.claimer_pattern = local_claimer_pattern(installation, self.host)
        self._marker = f"JOBFENCE_INSTALLATION={installation}".encode()
        self._ours: dict[tuple[int, int], bool] = {}
        self._boot = self._boot_time()
        self._hz = os.sysconf("SC_CLK_TCK")

    def _boot_time(self) -> float:
        with contextlib.suppress(OSError, ValueError):
            for line in (self.proc / "stat").read_text().splitlines():
                if line.startswith("btime "):
                    return float(line.split()[1])
        return 0.0

    def pod(self, pid: int) -> Pod | None:
        """The worker process ``pid`` as a pod, None if it is not a jobfence worker."""
        base = self.proc / str(pid)
        try:
            argv = [a for a in (base / "cmdline").read_bytes().decode(errors="replace")
                    .split("\0") if a]
            stat = (base / "stat").read_bytes()
        except OSError:
            return None
        # comm (field 2) is any process's own bytes: spaces, parentheses, not UTF-8. Split
        # after the last ')' and decode only the numeric fields behind it.
        fields = stat[stat.rfind(b")") + 2:].split()
        try:
            state, start_ticks = fields[0].decode("ascii"), int(fields[19])
        except (IndexError, ValueError):
            return None
        if state in ("Z", "X"):
            phase = "Failed"  # exited; a zombie keeps no cmdline, so check before argv
        elif not is_worker(argv) or not self._belongs(pid, start_ticks):
            return None
        else:
            phase = "Running"
        started = datetime.fromtimestamp(self._boot + start_ticks / self._hz, UTC)
        return Pod(name=f"local:{self.installation}:{self.host}:{pid}", phase=phase,
                   created_at=started, started_at=started)

    def _belongs(self, pid: int, start_ticks: int) -> bool:
        """Whether the process was started as a worker of this installation: its initial
        environment says so. Unreadable (another user's process) means no."""
        key = (pid, start_ticks)
        if key not in self._ours:
            try:
                environ = (self.proc / str(pid) / "environ").read_bytes().split(b"\0")
            except OSError:
                environ = []
            self._ours[key] = self._marker in environ
        return self._ours[key]

    def worker_pod_pages(self) -> Iterator[list[Pod]]:
        page: list[Pod] = []
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            pod = self.pod(int(entry.name))
            if pod is None or (pod.phase == "Failed" and not self._was_ours(int(entry.name))):
                continue
            page.append(pod)
            if len(page) == PAGE:
                yield page
                page = []
        yield page

    def _was_ours(self, pid: int) -> bool:
        """A zombie has no command line or environment left: it was one of ours if an
        earlier listing saw it running as one."""
        return any(p == pid and ours for (p, _), ours in self._ours.items())

    def _pid(self, name: str) -> int | None:
        prefix = f"local:{self.installation}:{self.host}:"
        if not name.startswith(prefix) or not name[len(prefix):].isdigit():
            return None
        return int(name[len(prefix):])

    def delete_pod(self, name: str, *, uid: str | None, grace_seconds: int) -> bool:
        """SIGTERM, then SIGKILL if the process outlives its grace (at most 5 s here)."""
        pid = self._pid(name)
        pod = self.pod(pid) if pid else None
        if pid is None or pod is None or pod.phase != "Running":
            return False
        try:
            os.kill(pid, signal.SIGKILL if grace_seconds <= 0 else signal.SIGTERM)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + min(grace_seconds, 5)
        while time.monotonic() < deadline:
            p = self.pod(pid)
            if p is None or p.phase != "Running":
                return True
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return True

    def delete_job(self, name: str, *, uid: str | None, grace_seconds: int) -> bool:
        return False  # local workers have no Jobs

    def trigger(self, function: str, *, requested_by: str, reason: str) -> str:
        """Start ``jobfence FUNCTION`` as a process of its own on this machine, with this
        process's environment (its installation, its settings), logging to
        ``$TMPDIR/jobfence-triggers``. Its database login is
        ``JOBFENCE_LOCAL_FUNCTIONS_DATABASE_URL`` when set (a periodic function needs the
        maintainer's role, which the console's own login lacks), else this process's."""
        logs = Path(tempfile.gettempdir()) / "jobfence-triggers"
        logs.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
        env = {**os.environ, "JOBFENCE_TRIGGERED_BY": requested_by,
               "JOBFENCE_TRIGGER_REASON": reason, "JOBFENCE_TRIGGER": "manual"}
        functions_url = os.environ.get("JOBFENCE_LOCAL_FUNCTIONS_DATABASE_URL")
        if functions_url:
            env["JOBFENCE_DATABASE_URL"] = functions_url
        try:
            with open(logs / f"{function}-{stamp}.log", "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", "jobfence.functions.cli",
                                         function], env=env, stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=log, start_new_session=True)
        except OSError as exc:
            raise ClusterError(f"starting {function} failed: {exc}") from exc
        threading.Thread(target=proc.wait, daemon=True).start()  # reaped when it ends
        return f"local-{function}-{proc.pid}"

    def review_token(self, token: str) -> Identity | None:
        raise ClusterError("the local cluster has no tokens to review: use "
                           "JOBFENCE_AUTH=none (on a loopback address) or proxy")
