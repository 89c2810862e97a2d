"""Reconciliation and orphan-cleanup through the real CLI with the `local` cluster (worker
processes on this machine, as in the demo): a worker SIGKILLed mid-job has its job back to
`pending` after one reconciliation pass — long before its lease would run out — whether its
process is a zombie (status drift) or gone (missing pod); a live worker is left alone; a
second concurrent run skips."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from devtools.sqlconn import connect
from jobfence.adapters.local_cluster import LocalCluster, is_worker
from jobfence.store import Store
from tests.conftest import run_cli
from tests.procs import enqueue, job, kill_quietly, spawn, wait_for

LONG_LEASE = {"JOBFENCE_LEASE_SECONDS": "120", "JOBFENCE_HEARTBEAT_SECONDS": "1"}
LOCAL = {"JOBFENCE_CLUSTER": "local", "JOBFENCE_RECONCILE_GRACE_SECONDS": "0",
         "JOBFENCE_RETRY_BASE_SECONDS": "0"}


def reconcile(dsn: str) -> dict[str, object]:
    r = run_cli(dsn, "reconciliation", **LOCAL)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def running_worker(dsn: str) -> tuple[str, subprocess.Popen[str]]:
    job_id = enqueue(dsn, 'sleep:{"seconds": 60}')
    worker = spawn(dsn, "worker", **LONG_LEASE, JOBFENCE_CLUSTER="local")
    wait_for(lambda: job(dsn, job_id)["status"] == "running")
    return job_id, worker


def test_sigkilled_worker_zombie_is_status_drift_and_job_is_back_at_once(dsn: str) -> None:
    job_id, worker = running_worker(dsn)
    assert job(dsn, job_id)["claimed_by"].endswith(f":{worker.pid}")
    started = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: getattr(LocalCluster().pod(worker.pid), "phase", None) == "Failed")
    report = reconcile(dsn)
    assert report["status_drift_detected"] == 1 and report["retried"] == 1
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


def test_second_concurrent_run_skips_and_exits_0(dsn: str) -> None:
    with connect(dsn) as holder:
        assert Store(holder).runs.try_lock("reconciliation")
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
    me = LocalCluster().pod(os.getpid())
    assert me is None  # pytest is not a worker
