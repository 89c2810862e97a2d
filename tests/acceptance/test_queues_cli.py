"""Queues through the real CLI: workers serve one queue (`--queue`, JOBFENCE_QUEUE) and
drain it within their budgets; `jobfence queue` pauses, resumes and limits a queue and
says how it stands; `enqueue --run-at/--delay` schedules a job, and every bad timestamp,
duration or queue name is exit 2 with nothing written."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devtools.audit import group_limit_violations
from devtools.sqlconn import connect
from tests.support import run_cli
from tests.support.procs import (
    FAST,
    enqueue,
    events,
    job,
    long_then_quick,
    read_pid,
    spawn,
    wait_for,
)

QUICK = 'sleep:{"seconds": 0}'


def report(dsn: str, *args: str, **env: str) -> dict[str, object]:
    r = run_cli(dsn, "worker", *args, **{**FAST, **env})
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def queue_status(dsn: str, queue: str) -> dict[str, object]:
    r = run_cli(dsn, "queue", "status", queue, "-o", "json")
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def table_counts(dsn: str) -> tuple[int, ...]:
    with connect(dsn) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM jobs) AS j, "
                           "(SELECT count(*) FROM job_events) AS e, "
                           "(SELECT count(*) FROM queues) AS q").fetchone()
    assert row is not None
    return tuple(row.values())


# -- a worker serves one queue --------------------------------------------------------------

def test_a_worker_serves_only_its_queue(dsn: str) -> None:
    reports = [enqueue(dsn, QUICK, "--queue", "reports", "--priority", "9") for _ in range(2)]
    default = [enqueue(dsn, QUICK) for _ in range(3)]
    out = report(dsn, "--max-jobs", "10")
    assert (out["queue"], out["claimed"], out["stopped_by"]) == ("default", 3, "nothing_ready")
    assert {j["job_id"] for j in out["jobs"]} == set(default)  # type: ignore[attr-defined]
    assert all(job(dsn, j)["status"] == "pending" for j in reports)
    out = report(dsn, "--max-jobs", "10", JOBFENCE_QUEUE="reports")
    assert (out["queue"], out["claimed"]) == ("reports", 2)
    assert all(job(dsn, j)["status"] == "succeeded" for j in reports)


def test_the_flag_wins_over_the_setting(dsn: str) -> None:
    enqueue(dsn, QUICK, "--queue", "a")
    out = report(dsn, "--queue", "a", JOBFENCE_QUEUE="b")
    assert (out["queue"], out["claimed"]) == ("a", 1)


# -- draining -------------------------------------------------------------------------------

def test_a_draining_worker_stops_after_max_jobs(dsn: str) -> None:
    ids = [enqueue(dsn, QUICK) for _ in range(5)]
    out = report(dsn, "--max-jobs", "3")
    assert (out["claimed"], out["succeeded"], out["stopped_by"]) == (3, 3, "max_jobs")
    assert sorted(job(dsn, j)["status"] for j in ids) == ["pending"] * 2 + ["succeeded"] * 3


def test_a_draining_worker_claims_nothing_after_max_seconds(dsn: str) -> None:
    """The budget stops the claims; the job in hand still runs to its end."""
    ids = [enqueue(dsn, 'sleep:{"seconds": 0.7}') for _ in range(5)]
    started = time.monotonic()
    out = report(dsn, "--max-jobs", "100", "--max-seconds", "1")
    assert out["stopped_by"] == "max_seconds"
    assert out["claimed"] == out["succeeded"] == 2  # claimed at 0 s and 0.7 s; not at 1.4 s
    assert time.monotonic() - started < 10
    assert sorted(job(dsn, j)["status"] for j in ids).count("succeeded") == 2


def test_each_job_of_a_draining_worker_is_claimed_when_its_work_starts(dsn: str) -> None:
    """The next claim rides on the previous job's terminal write: no claimed job waits
    behind a long one with its lease running."""
    ids = [enqueue(dsn, 'sleep:{"seconds": 0.5}') for _ in range(3)]
    out = report(dsn, "--max-jobs", "3")
    assert out["succeeded"] == 3
    with connect(dsn) as conn:
        rows = conn.execute("SELECT job_id, to_status, at FROM job_events WHERE job_id = "
                            "ANY(%s) AND to_status IN ('running', 'succeeded') "
                            "ORDER BY at", (ids,)).fetchall()
    order = [r["to_status"] for r in rows]
    assert order == ["running", "succeeded"] * 3
    attempts = {str(r["job_id"]) for r in rows}
    assert attempts == set(ids)
    with connect(dsn) as conn:
        fences = conn.execute("SELECT count(DISTINCT attempt_id) AS n FROM jobs "
                              "WHERE job_id = ANY(%s)", (ids,)).fetchone()
    assert fences == {"n": 3}


def test_sigterm_between_two_jobs_makes_no_claim(dsn: str, tmp_path: Path) -> None:
    """SIGTERM while a draining worker is between jobs (here: right after the first
    claim): the job in hand is given back and nothing more is claimed."""
    first = enqueue(dsn, "command:" + long_then_quick(tmp_path), "--priority", "1")
    rest = [enqueue(dsn, QUICK) for _ in range(3)]
    worker = spawn(dsn, "worker", "--max-jobs", "10", JOBFENCE_LEASE_SECONDS="60")
    read_pid(tmp_path / "pid")
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=10)
    assert worker.returncode == 1, err
    assert json.loads(out)["claimed"] == 1
    assert job(dsn, first)["status"] == "pending"
    for j in rest:
        assert [e["to_status"] for e in events(dsn, j)] == ["pending"]


# -- pause, resume, limit -------------------------------------------------------------------

def test_a_paused_queue_keeps_enqueueing_claims_nothing_and_lets_running_jobs_finish(
        dsn: str, tmp_path: Path) -> None:
    running = enqueue(dsn, 'command:{"argv": ["sleep", "5"]}', "--queue", "reports")
    worker = spawn(dsn, "worker", "--queue", "reports")
    wait_for(lambda: job(dsn, running)["status"] == "running")
    r = run_cli(dsn, "queue", "pause", "reports", "--reason", "warehouse upgrade")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"queue": "reports", "paused": True, "limit": None,
                                    "pending": 0, "scheduled": 0, "running": 1}
    held = [enqueue(dsn, QUICK, "--queue", "reports") for _ in range(3)]
    out = report(dsn, "--queue", "reports", "--max-jobs", "10")
    assert (out["claimed"], out["stopped_by"]) == (0, "nothing_ready")
    _, err = worker.communicate(timeout=20)
    assert worker.returncode == 0, err
    assert job(dsn, running)["status"] == "succeeded"
    assert queue_status(dsn, "reports") == {"queue": "reports", "paused": True,
                                            "limit": None, "pending": 3, "scheduled": 0,
                                            "running": 0}
    # Drain is global and separate: the other queues run on.
    enqueue(dsn, QUICK)
    assert report(dsn)["claimed"] == 1
    r = run_cli(dsn, "queue", "resume", "reports")
    assert r.returncode == 0 and json.loads(r.stdout)["paused"] is False
    out = report(dsn, "--queue", "reports", "--max-jobs", "10")
    assert out["claimed"] == 3
    assert all(job(dsn, j)["status"] == "succeeded" for j in held)


def test_queue_limit_and_status(dsn: str) -> None:
    for _ in range(4):
        enqueue(dsn, QUICK, "--queue", "exports")
    enqueue(dsn, QUICK, "--queue", "exports", "--delay", "PT1H")
    r = run_cli(dsn, "queue", "limit", "exports", "2")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["limit"] == 2
    assert queue_status(dsn, "exports") == {"queue": "exports", "paused": False, "limit": 2,
                                            "pending": 4, "scheduled": 1, "running": 0}
    r = run_cli(dsn, "queue", "status", "-o", "json")
    assert r.returncode == 0
    by_name = {q["queue"]: q for q in json.loads(r.stdout)}
    assert set(by_name) == {"default", "exports"} and by_name["exports"]["limit"] == 2
    text = run_cli(dsn, "queue", "status").stdout
    assert "exports" in text and "SCHEDULED" in text
    r = run_cli(dsn, "queue", "limit", "exports", "none")
    assert r.returncode == 0 and json.loads(r.stdout)["limit"] is None
    # A queue nobody has heard of: all zeros, not an error.
    assert queue_status(dsn, "nothing-here") == {"queue": "nothing-here", "paused": False,
                                                 "limit": None, "pending": 0,
                                                 "scheduled": 0, "running": 0}


def test_a_queue_rate_is_set_shown_and_removed(dsn: str) -> None:
    r = run_cli(dsn, "queue", "rate", "exports", "60/minute")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["queue"] == "exports"
    text = run_cli(dsn, "queue", "status", "exports").stdout
    assert "RATE" in text and "0/60 per 60s" in text
    assert run_cli(dsn, "queue", "rate", "exports", "none").returncode == 0
    assert "0/60" not in run_cli(dsn, "queue", "status", "exports").stdout


def test_eight_draining_workers_never_start_more_than_the_rate_in_a_window(dsn: str) -> None:
    """Eight worker processes at once, each started again as soon as it leaves (as KEDA
    starts a pool's Jobs), draining a queue with a rate of 3 per 2 seconds until three
    windows' worth have started: by the claims' own times no window of 2 s holds more
    than 3 starts."""
    assert run_cli(dsn, "queue", "rate", "metered", "3/PT2S").returncode == 0
    for _ in range(20):
        enqueue(dsn, QUICK, "--queue", "metered")
    def started() -> list[datetime]:
        with connect(dsn) as conn:
            return sorted(r["claimed_at"] for r in conn.execute(
                "SELECT claimed_at FROM jobs WHERE queue = 'metered' "
                "AND claimed_at IS NOT NULL"))

    deadline = time.monotonic() + 90
    procs: list[subprocess.Popen[str]] = []
    while len(started()) < 9 and time.monotonic() < deadline:  # three windows' worth
        for p in [p for p in procs if p.poll() is not None]:
            p.communicate()  # its pipes closed
            procs.remove(p)
        while len(procs) < 8:
            procs.append(spawn(dsn, "worker", "--queue", "metered", "--max-jobs", "20",
                               **FAST))
        time.sleep(0.05)
    for p in procs:
        p.communicate(timeout=60)
    times = started()
    window = timedelta(seconds=2)
    most = max(sum(1 for u in times[i:] if u - t <= window) for i, t in enumerate(times))
    assert most == 3 and len(times) >= 9, times


@pytest.mark.parametrize("args", [
    ("rate", "exports", "5"), ("rate", "exports", "-1/minute"), ("rate", "exports", "5/week"),
    ("rate", "exports", "5/PT0.5S"), ("rate", "exports", "5/P2D"), ("rate", "exports"),
    ("pause", "Not_A_Queue"), ("limit", "exports", "-1"), ("limit", "exports", "two"),
    ("limit", "exports", "1000001"), ("limit", "exports"), ("resume",), ("status", "a" * 64),
    ("stop", "exports"), ("fair", "exports", "maybe"), ("fair", "exports"),
    ("limit", "exports", "-1", "--per-group"), ("limit", "exports", "x", "--per-group"),
    ("groups",), ("groups", "Not_A_Queue"),
])
def test_bad_queue_commands_are_exit_2_and_write_nothing(dsn: str,
                                                         args: tuple[str, ...]) -> None:
    before = table_counts(dsn)
    r = run_cli(dsn, "queue", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines()[-1].startswith("jobfence: error:"), r.stderr
    assert table_counts(dsn) == before


# -- groups ---------------------------------------------------------------------------------

def test_groups_are_set_shown_and_served_in_turn(dsn: str) -> None:
    """A tenant's backlog and another's two jobs after it, each tenant limited to one
    running job and served in turn: `queue groups` shows each, `status` a job's group, and
    a draining worker's first claim takes one job of each tenant; never two of one running."""
    for _ in range(6):
        enqueue(dsn, QUICK, "--queue", "tenants", "--group", "acme")
    late = [enqueue(dsn, QUICK, "--queue", "tenants", "--group", "globex") for _ in range(2)]
    r = run_cli(dsn, "queue", "limit", "tenants", "1", "--per-group")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"queue": "tenants", "paused": False, "limit": None,
                                    "pending": 8, "scheduled": 0, "running": 0}
    assert run_cli(dsn, "queue", "fair", "tenants", "on").returncode == 0
    text = run_cli(dsn, "queue", "status", "tenants").stdout
    assert "PER GROUP" in text and re.search(r"tenants +active +- +1 +on ", text), text
    groups = json.loads(run_cli(dsn, "queue", "groups", "tenants", "-o", "json").stdout)
    assert groups == {"queue": "tenants", "groups": [
        {"group": "acme", "pending": 6, "scheduled": 0, "running": 0, "waiting": 0},
        {"group": "globex", "pending": 2, "scheduled": 0, "running": 0, "waiting": 0}]}
    assert json.loads(run_cli(dsn, "status", late[0], "-o", "json").stdout)["group"] \
        == "globex"
    assert "group: globex" in run_cli(dsn, "status", late[0]).stdout
    assert report(dsn, "--queue", "tenants", "--max-jobs", "8", "--concurrency", "2",
                  "--idle-seconds", "5")["claimed"] == 8
    with connect(dsn) as conn:
        claims = [str(r["job_id"]) for r in conn.execute(
            "SELECT e.job_id FROM jobfence.job_events e JOIN jobfence.jobs j USING (job_id) "
            "WHERE j.queue = 'tenants' AND e.to_status = 'running' ORDER BY e.event_id")]
        assert group_limit_violations(conn) == []
    assert set(claims[:2]) & set(late), claims  # the first claim took one of each


# -- scheduled jobs -------------------------------------------------------------------------

def test_a_job_scheduled_by_run_at_waits_for_its_time(dsn: str) -> None:
    at = (datetime.now(UTC) + timedelta(seconds=8)).replace(microsecond=0)
    job_id = enqueue(dsn, QUICK, "--run-at", at.isoformat().replace("+00:00", "Z"))
    early = report(dsn)  # first: on a loaded machine the checks below take seconds
    assert datetime.now(UTC) < at, "the worker ran too late to show anything"
    assert early["claimed"] == 0
    r = run_cli(dsn, "status", job_id, "-o", "json")
    view = json.loads(r.stdout)
    assert view["status"] == "pending" and datetime.fromisoformat(view["run_at"]) == at
    assert "scheduled for" in run_cli(dsn, "status", job_id).stdout
    wait_for(lambda: datetime.now(UTC) > at + timedelta(seconds=0.2), timeout=10)
    assert report(dsn)["claimed"] == 1
    assert job(dsn, job_id)["status"] == "succeeded"


def test_a_delayed_job_in_a_spec(dsn: str) -> None:
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(
        {"actions": [{"name": "sleep", "params": {"seconds": 0}}], "delay": "PT1H",
         "queue": "nightly"}))
    assert r.returncode == 0, r.stderr
    view = json.loads(run_cli(dsn, "status", json.loads(r.stdout)["job_id"], "-o",
                              "json").stdout)
    assert view["queue"] == "nightly"
    run_at = datetime.fromisoformat(view["run_at"])
    assert timedelta(minutes=59) < run_at - datetime.now(UTC) <= timedelta(hours=1)
    listed = json.loads(run_cli(dsn, "list", "--queue", "nightly", "-o", "json").stdout)
    assert [v["job_id"] for v in listed] == [view["job_id"]]
    assert json.loads(run_cli(dsn, "list", "--queue", "default", "-o", "json").stdout) == []


@pytest.mark.parametrize("args", [
    ("--run-at", "tomorrow"), ("--run-at", "2026-11-23T18:00:00"),
    ("--run-at", "2026-13-01T00:00:00Z"), ("--run-at", "1700000000"),
    ("--run-at", "2226-01-01T00:00:00Z"), ("--delay", "10 minutes"), ("--delay", "-PT1M"),
    ("--delay", "P200Y"), ("--run-at", "2026-11-23T18:00:00Z", "--delay", "PT1M"),
    ("--queue", "Reports"), ("--queue", "-x"), ("--queue", ""), ("--group", "has space"),
    ("--group", ""), ("--group", "-lead"), ("--group", "trail."), ("--group", "x" * 129),
    ("--group", "t\u00e9nant"),
])
def test_bad_schedules_and_queues_are_exit_2_and_write_nothing(
        dsn: str, args: tuple[str, ...]) -> None:
    before = table_counts(dsn)
    r = run_cli(dsn, "enqueue", QUICK, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert table_counts(dsn) == before


@pytest.mark.parametrize("extra", [
    {"run_at": "2026-11-23T18:00:00Z", "delay": "PT1M"}, {"run_at": 1700000000},
    {"run_at": "soon"}, {"delay": 60}, {"queue": "UPPER"}, {"queue": None}, {"group": 7},
    {"group": ""}, {"group": ["a"]}, {"group": "a\nb"},
])
def test_bad_schedules_in_a_spec_are_exit_2(dsn: str, extra: dict[str, object]) -> None:
    before = table_counts(dsn)
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(
        {"actions": [{"name": "sleep", "params": {"seconds": 0}}], **extra}))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert table_counts(dsn) == before
