"""Long-lived processes of a local cluster, started detached (their own session, output to
a log file) and stopped later by another process: each is recorded with its start time
(``/proc/PID/stat``), so that a recycled PID is never signalled by mistake."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ClusterError(RuntimeError):
    """What a person must know, in one line; the cluster was not (or no longer) started."""


@dataclass(frozen=True)
class Started:
    pid: int
    start_time: int
    log: str

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start_time

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


_DETACH = """
import os, sys
log, argv = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid:
    print(pid, flush=True)
    os._exit(0)
os.setsid()
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.dup2(fd, 1)
os.dup2(fd, 2)
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    print(f"cannot start {argv[0]}: {exc}", file=sys.stderr)
    os._exit(127)
"""
"""Start ``argv`` detached: in a session of its own, not a child of the starting process
(which may end long before it, or be a test process that must leave no child behind)."""


def start(argv: Sequence[str], *, log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> Started:
    log.parent.mkdir(parents=True, exist_ok=True)
    launcher = subprocess.run([sys.executable, "-c", _DETACH, str(log), *argv], env=env,
                              cwd=cwd, capture_output=True, text=True, check=False)
    if launcher.returncode != 0 or not launcher.stdout.strip().isdigit():
        raise ClusterError(f"could not start {argv[0]}: {launcher.stderr.strip()}")
    pid = int(launcher.stdout)
    for _ in range(100):
        started = _start_time(pid)
        if started is not None:
            return Started(pid, started, str(log))
        time.sleep(0.01)
    raise ClusterError(f"{argv[0]} exited at once: see {log}\n{_tail(log)}")


def stop(proc: Started, *, grace: float = 10.0) -> None:
    """SIGTERM the process and its session; SIGKILL what is left after ``grace``."""
    if not proc.alive():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while proc.alive() and time.monotonic() < deadline:
        _reap(proc.pid)
        time.sleep(0.05)
    if proc.alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while proc.alive() and time.monotonic() < deadline:
            _reap(proc.pid)
            time.sleep(0.05)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(check: Callable[[], T], *, what: str, timeout: float,
               proc: Started | None = None) -> T:
    """Poll ``check`` until it gives something true; ClusterError naming ``what`` (and the
    log of ``proc`` when it died meanwhile) after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise ClusterError(f"{what}: the process exited; its log: {proc.log}\n"
                               + _tail(Path(proc.log)))
        try:
            value = check()
            if value:
                return value
        except Exception as exc:
            last = exc
        time.sleep(0.1)
    detail = f" (last: {last})" if last else ""
    log = f"; its log: {proc.log}" if proc else ""
    raise ClusterError(f"{what}: not ready within {timeout:.0f} s{detail}{log}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
