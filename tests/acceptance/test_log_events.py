"""The log events operators search for, as the real CLI writes them (JSON lines on
stderr): every periodic pass says ``pass_started`` (with its trigger) then
``pass_finished`` (its duration and the counts it printed), the function in ``command`` —
or ``pass_skipped`` when another run holds its lease and ``pass_failed`` (error) when it
fails; reconciliation says ``missing_pod_detected`` for a claim whose worker is gone;
orphan-cleanup says ``orphaned_pod_detected`` (error, a bug indicator) then
``orphaned_pod_deleted`` for a worker that holds no claim."""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import Any

import pytest

from devtools.sqlconn import connect
from jobfence.cluster import PERIODIC_FUNCTIONS
from jobfence.store import Store
from tests.support import run_cli
from tests.support.factories import run_in_progress
from tests.support.procs import enqueue, job, kill_quietly, log_events, spawn, wait_for

LONG_LEASE = {"JOBFENCE_LEASE_SECONDS": "120", "JOBFENCE_HEARTBEAT_SECONDS": "1"}
LOCAL = {"JOBFENCE_CLUSTER": "local", "JOBFENCE_RECONCILE_GRACE_SECONDS": "0",
         "JOBFENCE_RETRY_BASE_SECONDS": "0", "JOBFENCE_ORPHAN_POD_GRACE_SECONDS": "0"}


def said(stderr: str, event: str) -> list[dict[str, Any]]:
    return [e for e in log_events(stderr) if e.get("event") == event]


def installation(dsn: str) -> str:
    with connect(dsn) as conn:
        return str(Store(conn).control.identity().installation)


@pytest.mark.parametrize("function", PERIODIC_FUNCTIONS)
def test_every_pass_says_it_started_then_finished_with_its_counts(dsn: str,
                                                                  function: str) -> None:
    r = run_cli(dsn, function)
    assert r.returncode == 0, r.stderr
    events = log_events(r.stderr)
    [started] = said(r.stderr, "pass_started")
    [finished] = said(r.stderr, "pass_finished")
    assert events.index(started) < events.index(finished)
    assert (started["command"], started["level"], started["trigger"]) == (
        function, "info", "scheduled")
    assert (finished["command"], finished["level"]) == (function, "info")
    summary = json.loads(r.stdout)
    assert finished["duration_seconds"] == summary.pop("duration_seconds") >= 0
    assert summary.pop("function") == function
    assert {k: finished[k] for k in summary} == summary
    assert started["timestamp"] <= finished["timestamp"]


def test_a_skipped_and_a_failed_pass_say_so(dsn: str) -> None:
    with connect(dsn) as conn:
        run_in_progress(Store(conn), "sweeper")
    r = run_cli(dsn, "sweeper")
    assert r.returncode == 0
    [skipped] = said(r.stderr, "pass_skipped")
    assert skipped["command"] == "sweeper" and "lease" in skipped["reason"]
    assert said(r.stderr, "pass_started") == []
    r = run_cli(dsn, "reconciliation", JOBFENCE_CLUSTER="kubernetes", KUBECONFIG="/nonexistent",
                KUBERNETES_SERVICE_HOST="")
    assert r.returncode == 1
    [failed] = said(r.stderr, "pass_failed")
    assert (failed["command"], failed["level"]) == ("reconciliation", "error")
    assert failed["error"] and said(r.stderr, "pass_finished") == []


def test_a_claim_whose_worker_is_gone_is_logged_missing(dsn: str) -> None:
    job_id = enqueue(dsn, 'sleep:{"seconds": 60}')
    worker = spawn(dsn, "worker", **LONG_LEASE, JOBFENCE_CLUSTER="local",
                   JOBFENCE_INSTALLATION=installation(dsn))
    wait_for(lambda: job(dsn, job_id)["status"] == "running")
    worker.kill()
    worker.communicate()
    r = run_cli(dsn, "reconciliation", **LOCAL)
    assert r.returncode == 0, r.stderr
    [missing] = said(r.stderr, "missing_pod_detected")
    assert (missing["job_id"], missing["job_status"], missing["level"]) == (
        job_id, "pending", "warning")


def test_a_worker_holding_no_claim_is_logged_detected_then_deleted(dsn: str) -> None:
    job_id = enqueue(dsn, 'sleep:{"seconds": 60}')
    mine = installation(dsn)
    worker = spawn(dsn, "worker", **LONG_LEASE, JOBFENCE_CLUSTER="local",
                   JOBFENCE_INSTALLATION=mine)
    try:
        wait_for(lambda: job(dsn, job_id)["status"] == "running")
        # Frozen, then its job cancelled: a running worker process that holds no claim.
        os.kill(worker.pid, signal.SIGSTOP)
        assert run_cli(dsn, "cancel", job_id).returncode == 0
        r = run_cli(dsn, "orphan-cleanup", **LOCAL)
        assert r.returncode == 0, r.stderr
        pod = f"local:{mine}:{socket.gethostname()}:{worker.pid}"
        [detected] = said(r.stderr, "orphaned_pod_detected")
        [deleted] = said(r.stderr, "orphaned_pod_deleted")
        assert (detected["pod"], detected["level"], detected["severity"]) == (
            pod, "error", "BUG_INDICATOR")
        assert (deleted["pod"], deleted["level"]) == (pod, "info")
        events = log_events(r.stderr)
        assert events.index(detected) < events.index(deleted)
        assert json.loads(r.stdout)["orphaned_pods_cleaned"] == 1
        worker.wait(timeout=15)
        assert worker.returncode == -signal.SIGKILL  # frozen: the SIGTERM never landed
    finally:
        kill_quietly(worker)


def test_the_console_log_format_is_for_people_and_shows_a_jobs_bytes_harmlessly(
        dsn: str) -> None:
    """``JOBFENCE_LOG_FORMAT=console``: one readable line per event on stderr — its time,
    level, event and key=value pairs, never JSON — and results still JSON on stdout. A job's
    output and error, which reach the worker's log, hold no terminal escape there: a person
    reads this format on a terminal."""
    import json as _json
    import re

    hostile = "printf 'out\\033]52;c;cm0gLXJmIC8K\\007\\n'; printf 'err\\033[2J\\n' >&2; exit 3"
    job_id = enqueue(dsn, "command:" + _json.dumps({"argv": ["sh", "-c", hostile]}),
                     "--max-attempts", "1")
    ran = run_cli(dsn, "worker", "--max-jobs", "1", JOBFENCE_LOG_FORMAT="console")
    assert ran.returncode == 1, ran.stderr
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert lines and not any(line.lstrip().startswith("{") for line in lines), lines
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z \[(debug|info|warning|"
                       r"error)\s*\] \S+")
    assert all(stamp.match(line) for line in lines if not line.startswith(" ")), lines
    assert any(f"job_id={job_id}" in line for line in lines), lines
    assert "\x1b" not in ran.stderr and "\x07" not in ran.stderr, ran.stderr
    assert "\\x1b" in ran.stderr  # shown, escaped
    swept = run_cli(dsn, "sweeper", JOBFENCE_LOG_FORMAT="console")
    assert swept.returncode == 0
    _json.loads(swept.stdout)  # the result stays JSON, on stdout
    assert "pass_finished" in swept.stderr and "{" not in swept.stderr.splitlines()[0]
