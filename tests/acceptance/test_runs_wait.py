"""`jobfence runs --wait FUNCTION`, the design's end-to-end helper, through the real CLI: it
returns the function's next successful run — one that begins after the wait did, never a
run already under way — with the run's JSON on stdout (exit 0), says on stderr each run
that fails meanwhile and goes on waiting, exits 7 at its timeout, and 2 on bad input."""

from __future__ import annotations

import json
import subprocess

import pytest

from devtools.sqlconn import connect
from jobfence.store import Store
from tests.support import run_cli
from tests.support.factories import run_in_progress
from tests.support.procs import spawn, wait_for

BROKEN_CLUSTER = {"JOBFENCE_CLUSTER": "kubernetes", "KUBECONFIG": "/nonexistent",
                  "KUBERNETES_SERVICE_HOST": ""}


def waiting(dsn: str, function: str) -> subprocess.Popen[str]:
    """`runs --wait FUNCTION`, once it has taken its starting point and looked once."""
    waiter = spawn(dsn, "runs", "--wait", function, "--timeout", "60", "--interval", "0.05")

    def looked() -> bool:
        assert waiter.poll() is None, waiter.communicate()
        with connect(dsn) as conn:
            row = conn.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE "
                               "application_name = 'jobfence-runs' AND query LIKE "
                               "'%%run_id >%%'").fetchone()
        return row is not None and row["n"] > 0

    wait_for(looked)
    return waiter


def test_waits_for_the_next_successful_run_not_one_already_under_way(dsn: str) -> None:
    assert run_cli(dsn, "sweeper").returncode == 0  # an earlier success: never the answer
    with connect(dsn) as conn:
        store = Store(conn)
        holder = run_in_progress(store, "sweeper")  # a run under way when the wait begins
        waiter = waiting(dsn, "sweeper")
        [under_way] = store.runs.recent(function="sweeper", status="running")
        store.runs.run_finished(run_id=under_way.run_id, function="sweeper",
                                trigger="manual", status="succeeded", counts={},
                                duration_seconds=1.0)
        store.runs.lease_release(function="sweeper", holder=holder)
    with pytest.raises(subprocess.TimeoutExpired):
        waiter.communicate(timeout=1.0)
    r = run_cli(dsn, "sweeper")
    assert r.returncode == 0, r.stderr
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    run = json.loads(out)
    assert (run["function"], run["status"]) == ("sweeper", "succeeded")
    assert run["run_id"] > under_way.run_id and run["duration_seconds"] >= 0
    assert run["counts"]["reclaimed"] == 0


def test_a_failed_run_is_said_and_the_wait_goes_on(dsn: str) -> None:
    waiter = waiting(dsn, "reconciliation")
    failed = run_cli(dsn, "reconciliation", **BROKEN_CLUSTER)
    assert failed.returncode == 1
    assert run_cli(dsn, "reconciliation").returncode == 0
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    assert json.loads(out)["status"] == "succeeded"
    [said] = [ln for ln in err.splitlines() if ln.startswith("jobfence: warning:")]
    assert "of reconciliation failed" in said and "still waiting for a success" in said


def test_no_success_before_the_timeout_is_exit_7(dsn: str) -> None:
    r = run_cli(dsn, "runs", "--wait", "lifecycle", "--timeout", "0.3")
    assert r.returncode == 7, r.stderr
    assert "no run of lifecycle begun after this command succeeded within 0.3s" in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("args", [
    ["--wait", "nope"], ["--wait", ""], ["--wait", "sweeper", "--timeout", "-1"],
    ["--wait", "sweeper", "--timeout", "nan"], ["--wait", "sweeper", "--interval", "0"],
    ["--wait", "sweeper", "--function", "sweeper"], ["--wait", "sweeper", "--status", "failed"],
    ["--timeout", "5"], ["--wait"],
])
def test_bad_input_is_exit_2_with_one_line(dsn: str, args: list[str]) -> None:
    r = run_cli(dsn, "runs", *args)
    assert r.returncode == 2, r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln] == [
        ln for ln in r.stderr.splitlines() if ln.startswith("jobfence: error:")]
