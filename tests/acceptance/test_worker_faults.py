"""A job's whole life under faults, driven through the real CLI: SIGTERM, SIGKILL, a paused
worker, cancel, failing actions with retries and resume, and a database restart.

The faults a worker can meet run for both kinds of worker pod: one job and exit, and
draining (``--max-jobs``/``--max-seconds``), which has finished other jobs before the one
hit by the fault and has more ready after it. A draining worker keeps the promise exactly
as a one-job worker does: SIGTERM gives back the job in hand within the same bound and no
claim follows it; a job lost to a fence or a cancel writes nothing, and the jobs after it
are fenced on their own."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.embedded_pg import EmbeddedPostgres
from devtools.sqlconn import connect
from jobfence.store.migrations import migrate
from tests.support import run_cli
from tests.support.procs import (
    FAST,
    action_results,
    alive,
    enqueue,
    events,
    job,
    log_events,
    long_then_quick,
    read_pid,
    spawn,
    wait_for,
)

pytestmark = pytest.mark.pooled  # directly and through PgBouncer


@dataclass(frozen=True)
class Mode:
    name: str
    args: tuple[str, ...]

    @property
    def draining(self) -> bool:
        return bool(self.args)

    def before(self, dsn: str) -> list[str]:
        """Jobs a draining worker runs first (a higher priority): the faulted job is then
        claimed together with the last one's terminal write."""
        return [enqueue(dsn, 'sleep:{"seconds": 0}', "--priority", "5")
                for _ in range(2)] if self.draining else []

    def after(self, dsn: str) -> list[str]:
        """Jobs ready behind the faulted one (a lower priority)."""
        return [enqueue(dsn, 'sleep:{"seconds": 0}', "--priority", "-5")
                for _ in range(2)] if self.draining else []


MODES = [Mode("one job", ()), Mode("draining", ("--max-jobs", "100", "--max-seconds", "120"))]


@pytest.fixture(params=MODES, ids=[m.name for m in MODES])
def mode(request: pytest.FixtureRequest) -> Mode:
    m: Mode = request.param
    return m


def untouched(dsn: str, job_ids: list[str]) -> None:
    """Never claimed: no claim after SIGTERM (or SIGKILL)."""
    for job_id in job_ids:
        row = job(dsn, job_id)
        assert (row["status"], row["attempt_count"]) == ("pending", 0), row
        assert [e["to_status"] for e in events(dsn, job_id)] == ["pending"]


def succeeded_once(dsn: str, job_ids: list[str]) -> None:
    for job_id in job_ids:
        row = job(dsn, job_id)
        assert (row["status"], row["attempt_count"]) == ("succeeded", 1), row


def test_worker_runs_a_job_to_success_and_exits_0(dsn: str) -> None:
    job_id = enqueue(dsn, 'command:{"argv": ["sh", "-c", "echo out; echo err >&2"]}',
                     'sleep:{"seconds": 0.1}')
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["function"] == "worker" and report["succeeded"] == 1
    row = job(dsn, job_id)
    assert row["status"] == "succeeded" and row["attempt_count"] == 1
    first = action_results(dsn, job_id)[0]
    assert first["result"]["stdout_tail"] == "out\n" and first["result"]["stderr_tail"] == "err\n"
    assert first["result"]["exit_code"] == 0


def test_one_worker_keeps_the_lease_of_each_job_it_runs_in_turn(dsn: str) -> None:
    """The heartbeat and watchdog threads outlive one attempt and guard the next: every job
    runs past the lease (2 s) and still finishes on its first claim."""
    job_ids = [enqueue(dsn, 'sleep:{"seconds": 2.6}') for _ in range(3)]
    r = run_cli(dsn, "worker", "--max-jobs", "3", **FAST)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["succeeded"] == 3
    for job_id in job_ids:
        row = job(dsn, job_id)
        assert row["status"] == "succeeded" and row["attempt_count"] == 1, row
        assert [e["to_status"] for e in events(dsn, job_id)] == ["pending", "running",
                                                                 "succeeded"]
    assert "self_fenced" not in r.stderr and "heartbeat_failed" not in r.stderr


def test_nothing_to_claim_exits_0(dsn: str) -> None:
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 0 and json.loads(r.stdout)["claimed"] == 0


def test_sigterm_releases_at_once_kills_child_and_another_worker_finishes(
        dsn: str, tmp_path: Path, mode: Mode) -> None:
    before = mode.before(dsn)
    job_id = enqueue(dsn, "command:" + long_then_quick(tmp_path), "--max-attempts", "3")
    after = mode.after(dsn)
    worker = spawn(dsn, "worker", *mode.args, JOBFENCE_LEASE_SECONDS="60",
                   JOBFENCE_HEARTBEAT_SECONDS="15")
    child = read_pid(tmp_path / "pid")
    worker.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    wait_for(lambda: job(dsn, job_id)["status"] != "running", timeout=5, interval=0.01)
    assert time.monotonic() - sent < 2.0
    out, err = worker.communicate(timeout=10)
    assert worker.returncode == 1, err
    report = json.loads(out)
    assert report["terminated"] is True and report["stopped_by"] == "sigterm"
    assert report["succeeded"] == len(before)
    succeeded_once(dsn, before)
    untouched(dsn, after)
    wait_for(lambda: not alive(child), timeout=2)
    row = job(dsn, job_id)
    assert row["status"] == "pending" and row["reason"] == "worker received SIGTERM"
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 0, r.stderr
    row = job(dsn, job_id)
    # A SIGTERM (an eviction, a drain) is not the job's fault: its attempt was given back.
    assert row["status"] == "succeeded" and row["attempt_count"] == 1
    assert row["interruptions"] == 1


def test_sigterm_on_last_attempt_gives_the_attempt_back(dsn: str, tmp_path: Path,
                                                       mode: Mode) -> None:
    """The README's promise: a job survives eviction, even on its last attempt."""
    before = mode.before(dsn)
    job_id = enqueue(dsn, "command:" + long_then_quick(tmp_path), "--max-attempts", "1")
    after = mode.after(dsn)
    worker = spawn(dsn, "worker", *mode.args, JOBFENCE_LEASE_SECONDS="60")
    read_pid(tmp_path / "pid")
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=10)
    assert worker.returncode == 1
    succeeded_once(dsn, before)
    untouched(dsn, after)
    row = job(dsn, job_id)
    assert row["status"] == "pending" and row["attempt_count"] == 0
    assert row["reason"] == "worker received SIGTERM"
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 0, r.stderr
    assert job(dsn, job_id)["status"] == "succeeded"


def test_sigterm_past_the_interruption_budget_counts_as_an_attempt(
        dsn: str, tmp_path: Path) -> None:
    """A job that is always interrupted still ends: past JOBFENCE_MAX_INTERRUPTIONS a
    SIGTERM spends the attempt, and on the last one the job fails."""
    job_id = enqueue(dsn, "command:" + long_then_quick(tmp_path), "--max-attempts", "1")
    worker = spawn(dsn, "worker", JOBFENCE_LEASE_SECONDS="60", JOBFENCE_MAX_INTERRUPTIONS="0")
    read_pid(tmp_path / "pid")
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=10)
    assert worker.returncode == 1
    row = job(dsn, job_id)
    assert row["status"] == "failed" and row["error"] == "worker received SIGTERM"
    assert row["interruptions"] == 1


def test_sigkill_mid_action_reclaimed_by_one_sweeper_pass(dsn: str, tmp_path: Path,
                                                          mode: Mode) -> None:
    before = mode.before(dsn)
    job_id = enqueue(dsn, "command:" + long_then_quick(tmp_path))
    after = mode.after(dsn)
    worker = spawn(dsn, "worker", *mode.args)
    child = read_pid(tmp_path / "pid")
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=10)
    wait_for(lambda: not alive(child), timeout=2)  # the child dies with its worker
    assert job(dsn, job_id)["status"] == "running"
    succeeded_once(dsn, before)
    untouched(dsn, after)
    wait_for(lambda: job(dsn, job_id)["visible_at"].timestamp() < time.time() - 0.1, timeout=5)
    r = run_cli(dsn, "sweeper", **FAST)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["retried"] == 1
    assert job(dsn, job_id)["status"] == "pending"
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 0, r.stderr
    row = job(dsn, job_id)
    assert row["status"] == "succeeded" and row["attempt_count"] == 2


def test_paused_worker_resumed_after_reclaim_writes_nothing(dsn: str, tmp_path: Path,
                                                            mode: Mode) -> None:
    # Attempt 1 sleeps 3 s; while its worker is paused, the lease runs out, the sweeper
    # reclaims the job and a second worker finishes it. Then the first worker resumes: it
    # writes nothing for the lost job, and a draining one goes on to the jobs after it,
    # each under its own fence.
    script = (f'if [ -e {tmp_path}/mark ]; then exit 0; fi; touch {tmp_path}/mark; '
              f'echo $$ > {tmp_path}/pid; exec sleep 3')
    before = mode.before(dsn)
    job_id = enqueue(dsn, "command:" + json.dumps({"argv": ["sh", "-c", script]}),
                     'sleep:{"seconds": 0}')
    after = mode.after(dsn)
    first = spawn(dsn, "worker", *mode.args)
    read_pid(tmp_path / "pid")
    first_attempt = job(dsn, job_id)["attempt_id"]
    first.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: job(dsn, job_id)["visible_at"].timestamp() < time.time() - 0.1,
                 timeout=10)
        assert run_cli(dsn, "sweeper", **FAST).returncode == 0
        second = run_cli(dsn, "worker", **FAST)
        assert second.returncode == 0, second.stderr
        time.sleep(3.2)  # the first attempt's child has finished by now
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=15)
    assert first.returncode == 1, err
    report = json.loads(out)
    assert report["lost"] == 1 and report["succeeded"] == len(before) + len(after)
    succeeded_once(dsn, before + after)
    row = job(dsn, job_id)
    assert row["status"] == "succeeded" and row["attempt_count"] == 2
    assert row["attempt_id"] != first_attempt
    assert [r for r in action_results(dsn, job_id) if r["attempt_id"] == first_attempt] == []
    terminal = [e for e in events(dsn, job_id) if e["to_status"] == "succeeded"]
    assert len(terminal) == 1 and terminal[0]["attempt_id"] == row["attempt_id"]
    said = {e["event"] for e in log_events(err)}
    assert said & {"self_fenced", "writeback_stale_attempt"}, err


def test_cancel_running_job_kills_child_within_a_heartbeat(dsn: str, tmp_path: Path,
                                                          mode: Mode) -> None:
    before = mode.before(dsn)
    job_id = enqueue(dsn, "command:" + long_then_quick(tmp_path))
    after = mode.after(dsn)
    worker = spawn(dsn, "worker", *mode.args, JOBFENCE_LEASE_SECONDS="10",
                   JOBFENCE_HEARTBEAT_SECONDS="0.5")
    child = read_pid(tmp_path / "pid")
    assert run_cli(dsn, "cancel", job_id, "--reason", "not needed").returncode == 0
    cancelled = time.monotonic()
    wait_for(lambda: not alive(child), timeout=3, interval=0.02)
    assert time.monotonic() - cancelled < 1.5  # one heartbeat period, plus scheduling
    _, err = worker.communicate(timeout=10)
    assert worker.returncode == 1, err
    assert "writeback_stale_attempt" in {e["event"] for e in log_events(err)}
    time.sleep(0.5)
    row = job(dsn, job_id)
    assert row["status"] == "cancelled" and row["error"] == "not needed"
    succeeded_once(dsn, before + after)  # a draining worker goes on after the lost job


def test_failing_action_three_attempts_with_backoff_then_failed(dsn: str) -> None:
    job_id = enqueue(dsn, 'command:{"argv": ["sh", "-c", "echo boom >&2; exit 3"]}',
                     "--max-attempts", "3")
    env = {"JOBFENCE_RETRY_BASE_SECONDS": "0.6", "JOBFENCE_RETRY_MAX_SECONDS": "10"}
    codes = []
    deadline = time.monotonic() + 30
    while job(dsn, job_id)["status"] != "failed" and time.monotonic() < deadline:
        r = run_cli(dsn, "worker", **{**FAST, **env})
        codes.append((r.returncode, json.loads(r.stdout)["claimed"]))
        time.sleep(0.1)
    row = job(dsn, job_id)
    assert row["status"] == "failed" and row["attempt_count"] == 3
    assert row["error"] == "command exited with 3: boom"
    assert "boom" in row["error_detail"]
    assert [c for c in codes if c[1]] == [(1, 1)] * 3
    trail = events(dsn, job_id)
    releases = [e for e in trail if e["from_status"] == "running" and e["to_status"] == "pending"]
    claims = [e for e in trail if e["to_status"] == "running"]
    assert len(releases) == 2 and len(claims) == 3
    # Equal jitter: the n-th retry waits between half and all of 0.6 * 2^(n-1) seconds.
    for n, (released, claimed) in enumerate(zip(releases, claims[1:], strict=True), 1):
        assert (claimed["at"] - released["at"]).total_seconds() >= 0.3 * 2 ** (n - 1)


def test_two_action_job_failing_in_second_resumes_at_second(dsn: str, tmp_path: Path) -> None:
    runs = tmp_path / "first-runs"
    first = json.dumps({"argv": ["sh", "-c", f"echo x >> {runs}"]})
    second = json.dumps({"argv": ["sh", "-c", f"test -e {tmp_path}/ok || "
                                              f"{{ touch {tmp_path}/ok; exit 1; }}"]})
    job_id = enqueue(dsn, f"command:{first}", f"command:{second}")
    assert run_cli(dsn, "worker", **FAST).returncode == 1
    assert job(dsn, job_id)["status"] == "pending"
    assert run_cli(dsn, "worker", **FAST).returncode == 0
    row = job(dsn, job_id)
    assert row["status"] == "succeeded" and row["attempt_count"] == 2
    assert runs.read_text() == "x\n"  # the first action ran once
    status = json.loads(run_cli(dsn, "status", job_id, "-o", "json").stdout)
    assert [a["status"] for a in status["actions"]] == ["succeeded", "succeeded"]


def test_command_timeout_fails_the_attempt(dsn: str) -> None:
    job_id = enqueue(dsn, 'command:{"argv": ["sleep", "30"], "timeout": "PT0.5S"}',
                     "--max-attempts", "1")
    started = time.monotonic()
    assert run_cli(dsn, "worker", **FAST).returncode == 1
    assert time.monotonic() - started < 10
    assert "timed out" in job(dsn, job_id)["error"]


def test_run_timeout_stops_the_action_and_counts_as_an_attempt(dsn: str) -> None:
    job_id = enqueue(dsn, 'command:{"argv": ["sleep", "30"]}', "--timeout", "PT1S",
                     "--max-attempts", "2")
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 1
    row = job(dsn, job_id)
    assert row["status"] == "pending" and row["reason"] == "timed out"
    run_cli(dsn, "worker", **FAST)
    row = job(dsn, job_id)
    assert row["status"] == "failed" and row["attempt_count"] == 2 and row["error"] == "timed out"


def test_database_restart_nothing_left_running(tmp_path: Path) -> None:
    """A short outage: the worker rides through it. A long one: it self-fences, and after
    its lease the sweeper hands the job to another worker. The server is durable (fsync on):
    an immediate stop is a crash, and a crash must not lose committed claims."""
    with EmbeddedPostgres(durable=True) as pg:
        with connect(pg.dsn) as conn:
            migrate(conn)
        env = {"JOBFENCE_LEASE_SECONDS": "6", "JOBFENCE_HEARTBEAT_SECONDS": "1",
               "JOBFENCE_CONNECT_TIMEOUT_SECONDS": "1"}
        short = enqueue(pg.dsn, 'command:{"argv": ["sleep", "3"]}')
        worker = spawn(pg.dsn, "worker", **env)
        wait_for(lambda: job(pg.dsn, short)["status"] == "running")
        pg.restart(down_seconds=1.5)
        _, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err
        assert job(pg.dsn, short)["status"] == "succeeded"

        long = enqueue(pg.dsn, "command:" + long_then_quick(tmp_path, 30))
        worker = spawn(pg.dsn, "worker", **env)
        child = read_pid(tmp_path / "pid")
        pg.stop(mode="immediate")
        try:
            _, err = worker.communicate(timeout=20)
        finally:
            pg.start()
        assert worker.returncode == 1
        assert "self_fenced" in {e["event"] for e in log_events(err)}, err
        assert not alive(child)
        wait_for(lambda: job(pg.dsn, long)["visible_at"].timestamp() < time.time(), timeout=10)
        assert run_cli(pg.dsn, "sweeper", **FAST).returncode == 0
        assert run_cli(pg.dsn, "worker", **FAST).returncode == 0
        row = job(pg.dsn, long)
        assert row["status"] == "succeeded" and row["attempt_count"] == 2
