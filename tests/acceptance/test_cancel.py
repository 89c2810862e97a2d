"""Cancel reaches the running command at once, and a cancelled run never overlaps the next
(invariant 12), driven through the real CLI and real worker processes — directly and
through PgBouncer in transaction mode (where the worker cannot LISTEN and asks instead).

At the shipped settings (a 120 s lease renewed every 30 s) a cancel used to reach the
command at the next heartbeat, while the job's resource was already free: `cancel` then
`retry` ran a second execution beside the first. Now the worker is told (or asks every
half second), kills its command and confirms it gone; until then the cancelled job keeps its
resource and `retry` answers 3, "still stopping".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from jobfence.errors import NotRetryable
from jobfence.store import Store
from tests.support import JOBFENCE, REPO, Dsn, cli_env, run_cli
from tests.support.procs import (
    alive,
    enqueue,
    job,
    kill_quietly,
    log_events,
    read_pid,
    spawn,
    wait_for,
)

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

SHIPPED = {"JOBFENCE_LEASE_SECONDS": "120", "JOBFENCE_HEARTBEAT_SECONDS": "30",
           "JOBFENCE_LOG_FORMAT": "json"}
"""The shipped lease and heartbeat: a cancel must not wait for the heartbeat."""


def sleeper(tmp: Path) -> str:
    """A command that writes its pid and sleeps for a minute."""
    return "command:" + json.dumps({"argv": ["sh", "-c", f"echo $$ > {tmp / 'pid'}; "
                                             "exec sleep 60"]})


def test_cancel_stops_the_command_long_before_the_next_heartbeat(dsn: str,
                                                                tmp_path: Path) -> None:
    job_id = enqueue(dsn, sleeper(tmp_path))
    worker = spawn(dsn, "worker", **SHIPPED)
    try:
        child = read_pid(tmp_path / "pid")
        assert run_cli(dsn, "cancel", job_id, "--reason", "not needed").returncode == 0
        cancelled = time.monotonic()
        wait_for(lambda: not alive(child), timeout=20, interval=0.01)
        took = time.monotonic() - cancelled
        _, err = worker.communicate(timeout=20)
    finally:
        kill_quietly(worker)
    # The next heartbeat was 30 s away; bench/ measures the figure (p95 under a second).
    assert took < 10, took
    said = [e["event"] for e in log_events(err)]
    assert "writeback_stale_attempt" in said and "stop_confirmed" in said, err
    row = job(dsn, job_id)
    assert (row["status"], row["stopping_attempt_id"]) == ("cancelled", None)


def test_a_cancelled_job_keeps_its_resource_until_its_command_is_confirmed_gone(
        dsn: str, tmp_path: Path) -> None:
    """The worker is frozen (SIGSTOP) when the cancel comes: nothing has killed the command
    yet. Until the worker wakes, kills it and confirms, the job is "stopping": retry
    answers 3 and the resource is busy."""
    job_id = enqueue(dsn, sleeper(tmp_path), "--resource", "db.events")
    worker = spawn(dsn, "worker", **SHIPPED)
    try:
        child = read_pid(tmp_path / "pid")
        os.kill(worker.pid, signal.SIGSTOP)
        assert run_cli(dsn, "cancel", job_id).returncode == 0
        status = json.loads(run_cli(dsn, "status", job_id, "-o", "json").stdout)
        assert status["status"] == "cancelled" and status["stopping_until"] is not None
        again = run_cli(dsn, "retry", job_id)
        assert again.returncode == 3 and "still stopping" in again.stderr, again.stderr
        busy = run_cli(dsn, "enqueue", 'sleep:{"seconds": 0}', "--resource", "db.events")
        assert busy.returncode == 3 and "db.events" in busy.stderr, busy.stderr
        assert alive(child)
        os.kill(worker.pid, signal.SIGCONT)
        wait_for(lambda: not alive(child), timeout=20, interval=0.02)
        wait_for(lambda: job(dsn, job_id)["stopping_attempt_id"] is None, timeout=20)
        worker.communicate(timeout=20)
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
        kill_quietly(worker)
    assert run_cli(dsn, "retry", job_id).returncode == 0
    assert job(dsn, job_id)["status"] == "pending"


def test_cancel_then_retry_at_once_never_runs_two_at_the_same_time(
        dsn: Dsn, store: Store, tmp_path: Path) -> None:
    """Cancel a running job and retry it at once, thirty times, with two workers waiting for
    work (``--idle-seconds``: each looks every few milliseconds) to claim it the moment it is
    pending. Each run takes an exclusive lock file for as long as any of its processes lives
    (flock: the kernel releases it when the last one dies) and writes `start`, or `overlap`
    when another run still holds the lock. (Fifteen times through PgBouncer.)"""
    runs = 30 if dsn.pooler == "none" else 15
    tmp_path.chmod(0o777)
    marks, lock = tmp_path / "marks", tmp_path / "lock"
    script = (f"flock -n {lock} sh -c 'echo start >> {marks}; exec sleep 60' "
              f"|| {{ echo overlap >> {marks}; exec sleep 60; }}")
    job_id = enqueue(dsn, "command:" + json.dumps({"argv": ["sh", "-c", script]}),
                     "--resource", "the-table", "--max-attempts", "1")
    stop = threading.Event()
    started: list[subprocess.Popen[bytes]] = []

    def worker() -> None:  # one waiting worker, started again if it ever ends
        while not stop.is_set():
            w = subprocess.Popen([*JOBFENCE, "worker", "--idle-seconds", "600"],
                                 env=cli_env(dsn, "worker", **SHIPPED), cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started.append(w)
            while w.poll() is None and not stop.is_set():
                time.sleep(0.1)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(2)]
    for t in pool:
        t.start()
    refused = 0
    try:
        for run in range(1, runs + 1):
            wait_for(lambda n=run: marks.exists() and len(marks.read_text().split()) >= n,
                     timeout=60, interval=0.01)  # the run started, alone or beside another
            assert "overlap" not in marks.read_text(), f"run {run} began beside another"
            store.jobs.cancel(job_id=job_id, reason=f"cancel {run}")
            while True:  # at once: "still stopping" until the worker confirms
                try:
                    store.jobs.retry(job_id=job_id, reason=f"retry {run}")
                    break
                except NotRetryable as exc:
                    assert "still stopping" in str(exc), exc
                    refused += 1
                    time.sleep(0.005)
    finally:
        stop.set()
        if job(dsn, job_id)["status"] in ("pending", "running"):
            store.jobs.cancel(job_id=job_id, reason="done")
        for t in pool:
            t.join(timeout=10)
        for w in started:
            w.terminate()
        for w in started:
            w.wait(timeout=60)
    text = marks.read_text()
    assert "overlap" not in text, text
    assert text.count("start") >= runs
    # Nothing but the fence-holding run wrote: one claim per retry, each cancelled.
    assert job(dsn, job_id)["attempt_count"] <= 1
