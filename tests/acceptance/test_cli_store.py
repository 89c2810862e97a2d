"""The operator CLI as a subprocess: every contract exit code of migrate, enqueue, status,
list, cancel and drain, JSON on stdout, one clear line on stderr, and nothing written when
the input is rejected."""

from __future__ import annotations

import json

import pytest

from devtools.sqlconn import connect
from tests.support import run_cli

UNREACHABLE = "postgresql://postgres@127.0.0.1:9/nowhere"


def count_jobs(dsn: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM jobs").fetchone()
    assert row is not None
    return int(row["n"])


def ok(dsn: str, *args: str, input: str | None = None) -> list[dict]:  # type: ignore[type-arg]
    r = run_cli(dsn, *args, input=input)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def test_enqueue_status_list_round_trip(dsn: str) -> None:
    [job] = ok(dsn, "enqueue", 'sleep:{"seconds": 1}', "command:{\"argv\": [\"true\"]}",
               "--resource", "db.events", "--max-attempts", "5", "--priority", "2",
               "--ttl", "PT1H30M", "--timeout", "P1DT12H", "--label", "team=data")
    assert job["status"] == "pending"
    [status] = ok(dsn, "status", job["job_id"], "-o", "json")
    for key in ("job_id", "status", "attempt_count", "max_attempts", "resource", "error",
                "created_at", "started_at", "finished_at", "actions"):
        assert key in status
    assert status["max_attempts"] == 5 and status["resource"] == "db.events"
    assert status["ttl"] == "PT1H30M" and status["timeout"] == "P1DT12H"
    assert [a["name"] for a in status["actions"]] == ["sleep", "command"]
    assert all(a["status"] == "pending" for a in status["actions"])
    [listed] = ok(dsn, "list", "-o", "json")
    assert listed == [status]
    text = run_cli(dsn, "status", job["job_id"])
    assert text.returncode == 0 and "PENDING" in text.stdout


def test_enqueue_spec_file_list_prints_one_object_per_spec(dsn: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "jobs.yaml"
    spec.write_text("- actions: [{name: sleep, params: {seconds: 0}}]\n"
                    "- actions: [{name: sleep, params: {seconds: 0}}]\n  resource: r1\n")
    out = ok(dsn, "enqueue", "--spec", str(spec))
    assert [o["status"] for o in out] == ["pending", "pending"]
    [first] = out[:1]
    waiting = ok(dsn, "enqueue", "sleep:{\"seconds\": 0}", "--after", first["job_id"])
    assert waiting[0]["status"] == "waiting"
    from_stdin = ok(dsn, "enqueue", "--spec", "-",
                    input=json.dumps({"actions": [{"name": "sleep", "params": {"seconds": 0}}]}))
    assert len(from_stdin) == 1


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (["nope"], None, "unknown action 'nope'"),
    (["sleep:{bad json}"], None, "not valid JSON"),
    (["sleep:{\"seconds\": -1}"], None, "seconds"),
    (["sleep:{\"seconds\": 1}", "--ttl", "PT1X"], None, "ISO 8601"),
    (["sleep:{\"seconds\": 1}", "--max-attempts", "-2"], None, "max_attempts"),
    (["sleep:{\"seconds\": 1}", "--after", "not-a-uuid"], None, "after"),
    (["sleep:{\"seconds\": 1}", "--label", "novalue"], None, "KEY=VALUE"),
    (["--spec", "-"], "{oops", "not valid JSON"),
    (["--spec", "-"], "[]", "empty"),
    (["--spec", "/nonexistent/spec.json"], None, "cannot read spec"),
    (["--spec", "-", "sleep"], "{}", "either --spec or ACTION"),
    ([], None, "nothing to enqueue"),
    (["sleep", "--no-such-flag"], None, "unrecognized arguments"),
    (['sleep:{"seconds": 1}', "--delay", "PT1H", "--expires-in", "PT10M"], None,
     "expire before it may start"),
    (['sleep:{"seconds": 1}', "--delay", "PT1H", "--expires-in", "PT1H"], None,
     "expire before it may start"),
    (['sleep:{"seconds": 1}', "--run-at", "2099-01-01T00:00:00Z", "--expires-in", "P1D"],
     None, "expire before it may start"),
    (["--spec", "-"], '{"actions": [{"name": "sleep", "params": {"seconds": 1}}], '
     '"delay": "PT2H", "expires_in": "PT1H"}', "expire before it may start"),
])
def test_enqueue_rejects_bad_input_with_exit_2_and_writes_nothing(
        dsn: str, args: list[str], stdin: str | None, message: str) -> None:
    r = run_cli(dsn, "enqueue", *args, input=stdin)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert r.stdout == ""
    assert count_jobs(dsn) == 0


def test_enqueue_conflicts_exit_3(dsn: str) -> None:
    ok(dsn, "enqueue", "sleep:{\"seconds\": 1}", "--resource", "db.events")
    r = run_cli(dsn, "enqueue", "sleep:{\"seconds\": 1}", "--resource", "db.events")
    assert r.returncode == 3 and "db.events" in r.stderr
    ok(dsn, "enqueue", "sleep:{\"seconds\": 1}", "--idempotency-key", "k1")
    [again] = ok(dsn, "enqueue", "sleep:{\"seconds\": 1}", "--idempotency-key", "k1")
    assert again["created"] is False
    r = run_cli(dsn, "enqueue", "sleep:{\"seconds\": 2}", "--idempotency-key", "k1")
    assert r.returncode == 3 and "different spec" in r.stderr
    assert count_jobs(dsn) == 2


def test_drain_refuses_enqueue_exit_4(dsn: str) -> None:
    [on] = ok(dsn, "drain", "on", "--reason", "upgrade")
    assert on["draining"] is True and on["scaler_value"] == 0
    r = run_cli(dsn, "enqueue", "sleep:{\"seconds\": 1}")
    assert r.returncode == 4 and "drain" in r.stderr
    [status] = ok(dsn, "drain", "status")
    assert status["draining"] is True and status["reason"] == "upgrade"
    assert ok(dsn, "drain", "off")[0]["draining"] is False
    ok(dsn, "enqueue", "sleep:{\"seconds\": 1}")
    assert count_jobs(dsn) == 1


def test_database_unreachable_is_exit_4(dsn: str) -> None:
    for args in (["migrate"], ["enqueue", "sleep:{\"seconds\": 1}"], ["list"],
                 ["drain", "status"]):
        r = run_cli(UNREACHABLE, *args)
        assert r.returncode == 4, (args, r.stderr)
        assert "database unavailable" in r.stderr


def test_missing_database_url_is_exit_2(dsn: str) -> None:
    r = run_cli("", "list")
    assert r.returncode == 2 and "JOBFENCE_DATABASE_URL" in r.stderr


def test_unknown_job_is_exit_5_and_malformed_id_exit_2(dsn: str) -> None:
    missing = "01a20000-0000-7000-8000-000000000000"
    for cmd in ("status", "cancel"):
        r = run_cli(dsn, cmd, missing)
        assert r.returncode == 5 and "not found" in r.stderr
        r = run_cli(dsn, cmd, "12345")
        assert r.returncode == 2 and "not a job id" in r.stderr
    r = run_cli(dsn, "enqueue", "sleep:{\"seconds\": 1}", "--after", missing)
    assert r.returncode == 5 and count_jobs(dsn) == 0


def test_cancel_then_cancel_again_is_exit_3(dsn: str) -> None:
    [job] = ok(dsn, "enqueue", "sleep:{\"seconds\": 1}")
    [out] = ok(dsn, "cancel", job["job_id"], "--reason", "not needed")
    assert out["status"] == "cancelled"
    r = run_cli(dsn, "cancel", job["job_id"])
    assert r.returncode == 3 and "already cancelled" in r.stderr
    [status] = ok(dsn, "status", job["job_id"], "-o", "json")
    assert status["status"] == "cancelled" and status["error"] == "not needed"


def test_list_filters_and_bad_arguments(dsn: str) -> None:
    ok(dsn, "enqueue", "sleep:{\"seconds\": 1}", "--resource", "a")
    ok(dsn, "enqueue", "sleep:{\"seconds\": 1}", "--resource", "b")
    assert len(ok(dsn, "list", "--resource", "a", "-o", "json")[0]) == 1
    assert ok(dsn, "list", "--status", "running", "-o", "json") == [[]]
    assert run_cli(dsn, "list", "--status", "bogus").returncode == 2
    assert run_cli(dsn, "list", "--limit", "0").returncode == 2
    assert run_cli(dsn, "drain", "sideways").returncode == 2


def test_top_level_help_and_unknown_command(dsn: str) -> None:
    r = run_cli(dsn, "--help")
    assert r.returncode == 0 and "enqueue" in r.stdout
    r = run_cli(dsn, "frobnicate")
    assert r.returncode == 2 and "unknown command" in r.stderr
