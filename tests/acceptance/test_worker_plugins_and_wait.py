"""Actions from installed packages (entry-point group `jobfence.actions`), a worker whose
action ignores the stop signal, `wait`, and the sweeper's lock."""

from __future__ import annotations

import json
import signal
import time

from devtools.sqlconn import connect
from jobfence.store import Store
from tests.support import REPO, run_cli
from tests.support.factories import run_in_progress
from tests.support.procs import FAST, enqueue, job, spawn, wait_for

PLUGIN = {"PYTHONPATH": str(REPO / "tests" / "fixtures" / "plugin")}


def test_plugin_action_is_validated_and_run(dsn: str) -> None:
    r = run_cli(dsn, "enqueue", "shout", **PLUGIN)
    assert r.returncode == 2 and "text" in r.stderr
    r = run_cli(dsn, "enqueue", "shout", **FAST)  # not installed here: unknown
    assert r.returncode == 2 and "unknown action 'shout'" in r.stderr
    job_id = enqueue(dsn, 'shout:{"text": "hello"}', **PLUGIN)
    r = run_cli(dsn, "worker", **FAST, **PLUGIN)
    assert r.returncode == 0, r.stderr
    with connect(dsn) as conn:
        row = conn.execute("SELECT result FROM job_action_results WHERE job_id = %s",
                           (job_id,)).fetchone()
    assert row is not None and row["result"]["shouted"] == "HELLO"


def test_sigterm_with_an_action_that_ignores_stop_still_releases_and_exits(dsn: str) -> None:
    job_id = enqueue(dsn, 'spin:{"seconds": 60}', **PLUGIN)
    worker = spawn(dsn, "worker", JOBFENCE_LEASE_SECONDS="60", **PLUGIN)
    wait_for(lambda: job(dsn, job_id)["status"] == "running")
    worker.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    wait_for(lambda: job(dsn, job_id)["status"] == "pending", timeout=5, interval=0.01)
    assert time.monotonic() - sent < 2.0
    worker.communicate(timeout=10)
    assert worker.returncode == 1
    assert time.monotonic() - sent < 5.0


def test_wait_exit_codes(dsn: str) -> None:
    ok = enqueue(dsn, 'sleep:{"seconds": 0}')
    r = run_cli(dsn, "wait", ok, "--timeout", "0.3")
    assert r.returncode == 7 and "did not finish within 0.3s" in r.stderr
    waiter = spawn(dsn, "wait", ok, "--timeout", "20")
    assert run_cli(dsn, "worker", **FAST).returncode == 0
    out, err = waiter.communicate(timeout=20)
    assert waiter.returncode == 0, err
    assert json.loads(out) == {"job_id": ok, "status": "succeeded", "error": None}
    assert "\r[" not in out  # stdout is not a terminal: no progress bar
    bad = enqueue(dsn, 'command:{"argv": ["false"]}', "--max-attempts", "1")
    run_cli(dsn, "worker", **FAST)
    assert run_cli(dsn, "wait", bad).returncode == 1
    cancelled = enqueue(dsn, 'sleep:{"seconds": 0}')
    run_cli(dsn, "cancel", cancelled)
    assert run_cli(dsn, "wait", cancelled).returncode == 1
    assert run_cli(dsn, "wait", "01a20000-0000-7000-8000-000000000000").returncode == 5
    assert run_cli(dsn, "wait", ok, "--timeout", "-1").returncode == 2


def test_wait_is_told_the_moment_a_job_ends(dsn: str) -> None:
    """The waiter polls only every 60 s: it can only return within seconds because the
    database notifies it; and it leaves no watcher behind."""
    job_id = enqueue(dsn, 'sleep:{"seconds": 0.5}')
    waiter = spawn(dsn, "wait", job_id, "--interval", "60", "--timeout", "120")
    with connect(dsn) as conn:
        wait_for(lambda: conn.execute("SELECT count(*) AS n FROM job_watchers"
                                      ).fetchone() == {"n": 1}, timeout=10)
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 0, r.stderr
    finished = time.monotonic()
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    assert time.monotonic() - finished < 5
    assert json.loads(out)["status"] == "succeeded"
    with connect(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM job_watchers").fetchone() == {"n": 0}


def test_second_concurrent_sweeper_skips_and_exits_0(dsn: str) -> None:
    with connect(dsn) as conn:
        holder = run_in_progress(Store(conn), "sweeper")
        r = run_cli(dsn, "sweeper")
        assert r.returncode == 0
        assert json.loads(r.stdout) == {"function": "sweeper", "skipped": True}
        Store(conn).runs.lease_release(function="sweeper", holder=holder)  # the first run ends
    r = run_cli(dsn, "sweeper")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["function"] == "sweeper" and out["reclaimed"] == 0
    with connect(dsn) as conn:
        runs = conn.execute("SELECT status FROM function_runs ORDER BY run_id").fetchall()
    assert [x["status"] for x in runs] == ["running", "skipped", "succeeded"]
