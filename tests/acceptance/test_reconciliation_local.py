"""Reconciliation and orphan-cleanup through the real CLI with the `local` cluster (worker
processes on this machine started with their installation in their environment, as the
local platform starts them): a worker SIGKILLed mid-job has its job back to `pending` after
one reconciliation pass — long before its lease would run out — whether its process is a
zombie or gone; a live worker is left alone; a worker started without its installation is
never judged; a second concurrent run skips."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from devtools.sqlconn import connect
from jobfence.adapters.local_cluster import LocalCluster, is_worker
from jobfence.store import Store
from tests.support import run_cli
from tests.support.factories import run_in_progress
from tests.support.procs import enqueue, job, kill_quietly, spawn, wait_for
from tests.support.reconciliation import LOCAL, installation, reconcile

LONG_LEASE = {"JOBFENCE_LEASE_SECONDS": "120", "JOBFENCE_HEARTBEAT_SECONDS": "1"}


def running_worker(dsn: str, **env: str) -> tuple[str, subprocess.Popen[str]]:
    job_id = enqueue(dsn, 'sleep:{"seconds": 60}')
    env = {"JOBFENCE_INSTALLATION": installation(dsn), **env}
    worker = spawn(dsn, "worker", **LONG_LEASE, JOBFENCE_CLUSTER="local", **env)
    wait_for(lambda: job(dsn, job_id)["status"] == "running")
    return job_id, worker


def test_sigkilled_worker_zombie_is_reclaimed_at_once(dsn: str) -> None:
    job_id, worker = running_worker(dsn)
    mine = installation(dsn)
    assert job(dsn, job_id)["claimed_by"].startswith(f"local:{mine}:")
    assert job(dsn, job_id)["claimed_by"].endswith(f":{worker.pid}")
    started = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: getattr(LocalCluster(mine).pod(worker.pid), "phase", None) == "Failed")
    report = reconcile(dsn)
    # A zombie keeps no environment: nothing vouches for it any more, so it is missing.
    assert report["missing_pods_detected"] + report["status_drift_detected"] == 1
    assert report["retried"] == 1
    row = job(dsn, job_id)
    assert row["status"] == "pending" and row["attempt_id"] is None
    assert time.monotonic() - started < 30  # the lease alone would take 120 s
    kill_quietly(worker)


def test_sigkilled_worker_gone_is_missing_and_a_new_worker_finishes(dsn: str) -> None:
    job_id, worker = running_worker(dsn)
    worker.kill()
    worker.communicate()  # reaped: the pod is gone
    report = reconcile(dsn)
    assert report["missing_pods_detected"] == 1
    assert job(dsn, job_id)["status"] == "pending"
    with connect(dsn) as conn:  # the sleep action would take 60 s; make the retry quick
        conn.execute("""UPDATE jobs SET actions = '[{"name": "sleep", "params":
                        {"seconds": 0}}]'::jsonb WHERE job_id = %s""", (job_id,))
    r = run_cli(dsn, "worker", JOBFENCE_CLUSTER="local")
    assert r.returncode == 0, r.stderr
    row = job(dsn, job_id)
    assert row["status"] == "succeeded" and row["attempt_count"] == 2


def test_live_worker_is_left_alone(dsn: str) -> None:
    job_id, worker = running_worker(dsn)
    try:
        report = reconcile(dsn)
        assert report["pods_listed"] >= 1
        assert report["missing_pods_detected"] == report["status_drift_detected"] == 0
        assert job(dsn, job_id)["status"] == "running"
    finally:
        kill_quietly(worker)


def test_a_worker_started_without_its_installation_is_never_judged(dsn: str) -> None:
    """Started by hand, without JOBFENCE_INSTALLATION: no local cluster vouches for it, so
    reconciliation leaves its claim to the sweeper and orphan-cleanup never signals it."""
    job_id, worker = running_worker(dsn, JOBFENCE_INSTALLATION="")
    try:
        assert not job(dsn, job_id)["claimed_by"].startswith("local:")
        report = reconcile(dsn)
        assert report["unverifiable_claims"] == 1 and report["retried"] == 0
        r = run_cli(dsn, "orphan-cleanup", **LOCAL, JOBFENCE_ORPHAN_POD_GRACE_SECONDS="0")
        assert r.returncode == 0 and json.loads(r.stdout)["orphaned_pods_cleaned"] == 0
        assert worker.poll() is None and job(dsn, job_id)["status"] == "running"
    finally:
        kill_quietly(worker)


def test_second_concurrent_run_skips_and_exits_0(dsn: str) -> None:
    with connect(dsn) as holder:
        run_in_progress(Store(holder), "reconciliation")
        r = run_cli(dsn, "reconciliation", **LOCAL)
    assert r.returncode == 0 and json.loads(r.stdout) == {"function": "reconciliation",
                                                          "skipped": True}


def test_worker_command_lines_are_recognised() -> None:
    assert is_worker(["/usr/bin/python3", "-m", "jobfence.functions.cli", "worker",
                      "--max-jobs", "2"])
    assert is_worker(["/venv/bin/python", "/venv/bin/jobfence", "worker"])
    assert is_worker(["python", "-m", "jobfence.functions.worker"])
    assert not is_worker(["python", "-m", "jobfence.functions.cli", "sweeper"])
    assert not is_worker(["worker"])
    me = LocalCluster("jf-test").pod(os.getpid())
    assert me is None  # pytest is not a worker


def test_a_process_named_with_hostile_bytes_does_not_stop_the_pass(dsn: str) -> None:
    """Any process on the machine may name itself with bytes that are not UTF-8 (or with
    parentheses and spaces); the pass reads every /proc/PID/stat and must judge the workers
    all the same."""
    hostile = subprocess.Popen(
        ["sh", "-c", r"printf '\377) (\376' > /proc/$$/comm; sleep 60"])
    try:
        wait_for(lambda: b"\xff" in Path(f"/proc/{hostile.pid}/stat").read_bytes())
        job_id, worker = running_worker(dsn)
        kill_quietly(worker)
        report = reconcile(dsn)
        assert report["retried"] == 1
        assert job(dsn, job_id)["status"] == "pending"
        assert LocalCluster(installation(dsn)).pod(hostile.pid) is None
    finally:
        kill_quietly(hostile)
