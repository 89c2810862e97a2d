"""A worker running many jobs at once, through the real CLI: ten 30 s commands in one
process, SIGTERM gives every one back within the bound of one job and kills every child;
a cancel stops only its own job's child; SIGKILL leaves every claim to one reconciliation
pass; a paused worker resumed after its jobs were reclaimed writes nothing for any of them;
and each job in hand keeps its own lease, fence and child process."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support import run_cli
from tests.support.procs import FAST, alive, enqueue, events, job, read_pid, spawn, wait_for
from tests.support.reconciliation import installation, reconcile

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

N = 10
SLOW = {"JOBFENCE_LEASE_SECONDS": "60", "JOBFENCE_HEARTBEAT_SECONDS": "15"}


def long_commands(dsn: str, tmp_path: Path, n: int = N, seconds: int = 30) -> list[str]:
    """n jobs, each a command that writes its pid to pid-<i> and then sleeps."""
    out = []
    for i in range(n):
        script = f"echo $$ > {tmp_path}/pid-{i}; exec sleep {seconds}"
        out.append(enqueue(dsn, "command:" + json.dumps({"argv": ["sh", "-c", script]})))
    return out


def children(tmp_path: Path, n: int = N) -> list[int]:
    return [read_pid(tmp_path / f"pid-{i}") for i in range(n)]


def test_sigterm_with_ten_jobs_in_hand_gives_every_one_back_at_once(
        dsn: str, tmp_path: Path) -> None:
    jobs = long_commands(dsn, tmp_path)
    worker = spawn(dsn, "worker", "--concurrency", str(N), "--max-jobs", "100", **SLOW)
    pids = children(tmp_path)
    assert all(job(dsn, j)["status"] == "running" for j in jobs)
    assert len({job(dsn, j)["attempt_id"] for j in jobs}) == N  # a fence each
    worker.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    wait_for(lambda: all(job(dsn, j)["status"] == "pending" for j in jobs), timeout=5,
             interval=0.01)
    assert time.monotonic() - sent < 2.0  # measured in bench/: well under 0.5 s
    out, err = worker.communicate(timeout=10)
    assert worker.returncode == 1, err
    report = json.loads(out)
    assert report["terminated"] is True and report["stopped_by"] == "sigterm"
    assert report["claimed"] == N and report["concurrency"] == N
    wait_for(lambda: not any(alive(p) for p in pids), timeout=2)
    for j in jobs:
        row = job(dsn, j)
        assert (row["status"], row["attempt_count"], row["reason"]) == (
            "pending", 0, "worker received SIGTERM")
        assert [e["to_status"] for e in events(dsn, j)] == ["pending", "running", "pending"]


def test_a_cancel_stops_only_its_own_jobs_child(dsn: str, tmp_path: Path) -> None:
    jobs = long_commands(dsn, tmp_path, n=4)
    worker = spawn(dsn, "worker", "--concurrency", "4", "--max-jobs", "4", **SLOW)
    try:
        pids = children(tmp_path, 4)
        r = run_cli(dsn, "cancel", jobs[1])
        assert r.returncode == 0, r.stderr
        cancelled = time.monotonic()
        wait_for(lambda: not alive(pids[1]), timeout=5, interval=0.01)
        assert time.monotonic() - cancelled < 2.0
        wait_for(lambda: job(dsn, jobs[1])["stopping_attempt_id"] is None, timeout=5)
        time.sleep(0.5)
        assert all(alive(p) for i, p in enumerate(pids) if i != 1)
        assert all(job(dsn, j)["status"] == "running" for i, j in enumerate(jobs) if i != 1)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=10)
    assert job(dsn, jobs[1])["status"] == "cancelled"


def test_sigkill_with_many_claims_is_reclaimed_by_one_reconciliation_pass(
        dsn: str, tmp_path: Path) -> None:
    jobs = long_commands(dsn, tmp_path, n=5)
    worker = spawn(dsn, "worker", "--concurrency", "5", "--max-jobs", "5",
                   JOBFENCE_CLUSTER="local",
                   JOBFENCE_INSTALLATION=installation(dsn),
                   JOBFENCE_LEASE_SECONDS="120", JOBFENCE_HEARTBEAT_SECONDS="1")
    pids = children(tmp_path, 5)
    os.kill(worker.pid, signal.SIGKILL)
    worker.communicate()  # reaped: the pod is gone
    wait_for(lambda: not any(alive(p) for p in pids), timeout=2)  # children die with it
    report = reconcile(dsn)
    assert report["retried"] == 5
    for j in jobs:
        row = job(dsn, j)
        assert row["status"] == "pending" and row["attempt_id"] is None


def test_a_paused_worker_resumed_after_its_jobs_were_reclaimed_writes_nothing(
        dsn: str, tmp_path: Path) -> None:
    jobs = [enqueue(dsn, 'sleep:{"seconds": 3}') for _ in range(3)]
    first = spawn(dsn, "worker", "--concurrency", "3", "--max-jobs", "3")
    wait_for(lambda: all(job(dsn, j)["status"] == "running" for j in jobs))
    fences = {j: job(dsn, j)["attempt_id"] for j in jobs}
    first.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: all(job(dsn, j)["visible_at"].timestamp() < time.time() - 0.1
                             for j in jobs), timeout=10)
        assert run_cli(dsn, "sweeper", **FAST).returncode == 0
        with_quick = run_cli(dsn, "worker", "--concurrency", "3", "--max-jobs", "3", **FAST)
        assert with_quick.returncode == 0, with_quick.stderr
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=15)
    assert first.returncode == 1, err
    assert json.loads(out)["lost"] == 3
    for j in jobs:
        row = job(dsn, j)
        assert row["status"] == "succeeded" and row["attempt_id"] != fences[j]
        terminal = [e for e in events(dsn, j) if e["to_status"] == "succeeded"]
        assert len(terminal) == 1 and terminal[0]["attempt_id"] == row["attempt_id"]


def test_a_jobs_daemon_dies_with_its_job_and_the_others_children_live_on(
        dsn: str, tmp_path: Path) -> None:
    """Two jobs at once: one leaves a daemon in a session of its own and ends; its daemon
    is killed (it carries the job's attempt id), the other job's child runs on."""
    leaver = enqueue(dsn, "command:" + json.dumps({"argv": ["sh", "-c", (
        f"setsid sleep 300 & echo $! > {tmp_path}/daemon")]}), "--priority", "5")
    [stayer] = long_commands(dsn, tmp_path, n=1, seconds=30)
    worker = spawn(dsn, "worker", "--concurrency", "2", "--max-jobs", "2", **SLOW)
    try:
        [child] = children(tmp_path, 1)
        daemon = read_pid(tmp_path / "daemon")
        wait_for(lambda: job(dsn, leaver)["status"] == "succeeded")
        wait_for(lambda: not alive(daemon), timeout=5)
        assert alive(child) and job(dsn, stayer)["status"] == "running"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=10)
