"""Snooze through the real worker (a subprocess): a command that exits 75 with a delay in
JOBFENCE_SNOOZE_FILE, and a plugin action that raises ``Snooze``, give their job back —
pending again, visible after the delay, the attempt not spent, the snooze counted, shown by
``status`` and recorded in the audit trail; the job resumes after the actions it had
finished; past JOBFENCE_MAX_SNOOZES it fails saying why; and a snooze file that is missing,
garbage, a link or huge is an ordinary failure that says what was wrong and harms
nothing. The same request through the command sidecar: tests/acceptance/test_command_sidecar.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support import REPO, run_cli
from tests.support.procs import FAST, enqueue, events, job

PLUGIN = {"PYTHONPATH": str(REPO / "tests" / "fixtures" / "plugin")}


def command(script: str) -> str:
    return "command:" + json.dumps({"argv": ["sh", "-c", script]})


def worker(dsn: str, *args: str, **env: str) -> dict[str, object]:
    r = run_cli(dsn, "worker", *args, **{**FAST, **env})
    assert r.returncode == 0, r.stderr
    report: dict[str, object] = json.loads(r.stdout)
    return report


def test_a_command_that_exits_75_with_a_delay_is_pending_again_without_spending_an_attempt(
        dsn: str) -> None:
    job_id = enqueue(dsn, command('printf PT1H > "$JOBFENCE_SNOOZE_FILE"; exit 75'))
    before = datetime.now(UTC)
    report = worker(dsn)
    assert (report["claimed"], report["snoozed"], report["failed"]) == (1, 1, 0)
    row = job(dsn, job_id)
    assert (row["status"], row["attempt_count"], row["snoozes"]) == ("pending", 0, 1)
    assert before + timedelta(minutes=59) < row["visible_at"] < before + timedelta(minutes=61)
    snoozed = [e for e in events(dsn, job_id) if e["from_status"] == "running"]
    assert [(e["to_status"], e["reason"]) for e in snoozed] == [
        ("pending", "snoozed for PT1H by action 1 (command)")]
    status = json.loads(run_cli(dsn, "status", job_id, "-o", "json").stdout)
    assert (status["snoozes"], status["attempt_count"], status["status"]) == (1, 0, "pending")
    assert status["actions"][0]["status"] == "snoozed"


def test_a_snoozed_claims_output_is_shown_by_status_and_logs(dsn: str) -> None:
    job_id = enqueue(dsn, command('echo "table locked, later"; echo why >&2; '
                                  'printf PT1H > "$JOBFENCE_SNOOZE_FILE"; exit 75'))
    assert worker(dsn)["snoozed"] == 1
    status = json.loads(run_cli(dsn, "status", job_id, "-o", "json").stdout)
    result = status["actions"][0]["result"]
    assert (result["exit_code"], result["stdout_tail"]) == (75, "table locked, later\n")
    r = run_cli(dsn, "logs", job_id, "--stream", "stdout")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "table locked, later\n"


def test_a_plugin_action_that_raises_snooze_is_pending_again(dsn: str) -> None:
    job_id = enqueue(dsn, 'snoozer:{"seconds": 120}', **PLUGIN)
    report = worker(dsn, **PLUGIN)
    assert report["snoozed"] == 1
    row = job(dsn, job_id)
    assert (row["status"], row["attempt_count"], row["snoozes"]) == ("pending", 0, 1)
    assert row["visible_at"] > datetime.now(UTC) + timedelta(seconds=100)
    assert events(dsn, job_id)[-1]["reason"] == "snoozed for PT2M by action 1 (snoozer)"


def test_a_snoozed_job_resumes_after_the_actions_it_had_finished(dsn: str,
                                                                 tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    once = tmp_path / "once"
    job_id = enqueue(
        dsn, command(f"echo ran >> {ran}"),
        command(f'[ -e {once} ] && exit 0; touch {once}; echo 0.001 > "$JOBFENCE_SNOOZE_FILE"; '
                "exit 75"),
        command(f"echo third >> {ran}"), "--max-attempts", "1")
    report = worker(dsn, "--max-jobs", "2", "--idle-seconds", "5")  # it waits for it
    assert (report["snoozed"], report["succeeded"]) == (1, 1), report
    row = job(dsn, job_id)
    assert (row["status"], row["attempt_count"], row["snoozes"]) == ("succeeded", 1, 1)
    assert ran.read_text() == "ran\nthird\n"  # the first action ran once


def test_past_max_snoozes_the_job_fails_saying_why(dsn: str) -> None:
    job_id = enqueue(dsn, command('echo 0.001 > "$JOBFENCE_SNOOZE_FILE"; exit 75'))
    r = run_cli(dsn, "worker", "--max-jobs", "4", "--idle-seconds", "5",
                **{**FAST, "JOBFENCE_MAX_SNOOZES": "3"})
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert (report["snoozed"], report["failed"]) == (3, 1)
    row = job(dsn, job_id)
    assert (row["status"], row["attempt_count"], row["snoozes"]) == ("failed", 1, 3)
    assert row["error"] == ("snoozed 3 times, the most a job may (asked again: snoozed for "
                            "PT0.001S by action 1 (command))")


@pytest.mark.parametrize(("script", "error"), [
    ("exit 75", "it wrote no delay into $JOBFENCE_SNOOZE_FILE"),
    ('echo soon > "$JOBFENCE_SNOOZE_FILE"; exit 75', "its snooze file says no delay: "
                                                     "b'soon\\n' is not a delay"),
    ('echo P2D > "$JOBFENCE_SNOOZE_FILE"; exit 75', "a snooze lasts from a millisecond to P1D"),
    ('ln -s /etc/hostname "$JOBFENCE_SNOOZE_FILE"; exit 75',
     "its snooze file was refused: .jobfence-snooze-0: a symbolic link"),
    ('mkfifo "$JOBFENCE_SNOOZE_FILE"; exit 75', "a FIFO"),
    ('head -c 10000000 /dev/zero > "$JOBFENCE_SNOOZE_FILE"; exit 75', "longer than 100 bytes"),
])
def test_exit_75_without_a_valid_snooze_file_fails_clearly(dsn: str, script: str,
                                                           error: str) -> None:
    job_id = enqueue(dsn, command(script), "--max-attempts", "1")
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 1, r.stderr
    row = job(dsn, job_id)
    assert (row["status"], row["snoozes"]) == ("failed", 0)
    assert row["error"].startswith("command exited with 75 to snooze, but "), row["error"]
    assert error in row["error"], row["error"]


def test_logs_numbers_attempts_as_status_and_the_output_lines_do(
        dsn: str, tmp_path: Path) -> None:
    once = tmp_path / "once"
    job_id = enqueue(dsn, command(
        f'echo "claim"; [ -e {once} ] && exit 0; touch {once}; '
        'echo 0.001 > "$JOBFENCE_SNOOZE_FILE"; exit 75'))
    r = run_cli(dsn, "worker", "--max-jobs", "2", "--idle-seconds", "5", **FAST)
    assert r.returncode == 0, r.stderr
    # Both claims ran as attempt 1 (the snooze spent none): the worker's own output lines,
    # `status`, and `logs` say so alike.
    said = {json.loads(line)["attempt"] for line in r.stderr.splitlines()
            if line.startswith("{") and json.loads(line).get("event") == "output"}
    assert said == {1}
    status = json.loads(run_cli(dsn, "status", job_id, "-o", "json").stdout)
    assert (status["status"], status["attempt_count"]) == ("succeeded", 1)
    shown = run_cli(dsn, "logs", job_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("==> attempt 1, action 1 (command): stdout")
    assert run_cli(dsn, "logs", job_id, "--attempt", "1").stdout == shown.stdout
    assert run_cli(dsn, "logs", job_id, "--attempt", "2").returncode == 2
