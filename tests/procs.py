"""Helpers for tests that drive real worker processes."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from devtools.sqlconn import connect
from tests.conftest import JOBFENCE, REPO, cli_env, run_cli

T = TypeVar("T")

# Short leases so that expiry-driven scenarios take seconds, not minutes.
FAST = {"JOBFENCE_LEASE_SECONDS": "2", "JOBFENCE_HEARTBEAT_SECONDS": "0.4",
        "JOBFENCE_RETRY_BASE_SECONDS": "0", "JOBFENCE_LOG_FORMAT": "json"}


def spawn(dsn: str, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*JOBFENCE, *args], env=cli_env(dsn, args[0] if args else None,
                                                              **{**FAST, **env}), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(fn: Callable[[], T], timeout: float = 20.0, interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(interval)


def job(dsn: str, job_id: str) -> dict[str, Any]:
    with connect(dsn) as conn:
        row = conn.execute("SELECT * FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def events(dsn: str, job_id: str) -> list[dict[str, Any]]:
    with connect(dsn) as conn:
        return conn.execute("SELECT * FROM job_events WHERE job_id = %s ORDER BY event_id",
                            (job_id,)).fetchall()


def action_results(dsn: str, job_id: str) -> list[dict[str, Any]]:
    with connect(dsn) as conn:
        return conn.execute("SELECT * FROM job_action_results WHERE job_id = %s "
                            "ORDER BY finished_at", (job_id,)).fetchall()


def enqueue(dsn: str, *args: str, **env: str) -> str:
    r = run_cli(dsn, "enqueue", *args, **env)
    assert r.returncode == 0, r.stderr
    return str(json.loads(r.stdout)["job_id"])


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or the read
        return False


def read_pid(path: Path, timeout: float = 20.0) -> int:
    return wait_for(lambda: int(path.read_text()) if path.exists() and path.read_text().strip()
                    else 0, timeout)


def log_events(stderr: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def long_then_quick(tmp: Path, seconds: int = 60) -> str:
    """A command that runs long on its first attempt (writing its pid) and exits 0 at once
    on later ones: proves that a later attempt finished the job."""
    mark, pid = tmp / "mark", tmp / "pid"
    script = (f'if [ -e {mark} ]; then exit 0; fi; touch {mark}; echo $$ > {pid}; '
              f'exec sleep {seconds}')
    return json.dumps({"argv": ["sh", "-c", script]})


def kill_quietly(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    p.communicate()


__all__ = ["FAST", "action_results", "alive", "enqueue", "events", "job", "kill_quietly",
           "log_events", "long_then_quick", "read_pid", "spawn", "wait_for"]

