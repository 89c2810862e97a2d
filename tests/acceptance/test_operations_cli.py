"""Operating an installation through the real CLI, each command as its role's login: `schedule`
add/list/show/pause/resume/delete (bad cron, time zone or spec: exit 2, nothing written),
the `schedules` pass as the maintainer (concurrent runs and a manual one enqueue each tick
once), `retry`/`cancel` in bulk (dry run, the limit and `--yes`), what a job runs in
`status` and `list` with env values masked (revealed only on request, audited, and never
in a log), and `completion` for each shell."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from devtools.sqlconn import connect
from tests.support import JOBFENCE, REPO, cli_env, run_cli
from tests.support.procs import enqueue

SECRET = "hunter2-do-not-show"
CMD = json.dumps({"argv": ["sh", "-c", "echo hi; exit 3"], "env": {"API_TOKEN": SECRET}})


def counts(dsn: str) -> tuple[int, ...]:
    with connect(dsn) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM schedules) AS s, "
                           "(SELECT count(*) FROM jobs) AS j, "
                           "(SELECT count(*) FROM control_events) AS c").fetchone()
    assert row is not None
    return tuple(row.values())


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "nightly.yaml"
    path.write_text(f"actions:\n  - name: command\n    params: {CMD}\nqueue: reports\n")
    return path


def test_a_schedule_from_add_to_delete(dsn: str, spec_file: Path) -> None:
    r = run_cli(dsn, "schedule", "add", "nightly", "--cron", "30 2 * * *", "--timezone",
                "Europe/Riga", "--spec", str(spec_file))
    assert r.returncode == 0, r.stderr
    added = json.loads(r.stdout)
    assert (added["cron"], added["timezone"], added["paused"]) == (
        "30 2 * * *", "Europe/Riga", False)
    assert added["spec"]["actions"][0]["params"]["env"] == {"API_TOKEN": "<masked>"}
    assert SECRET not in r.stdout
    again = run_cli(dsn, "schedule", "add", "nightly", "--cron", "* * * * *", "--spec",
                    str(spec_file))
    assert again.returncode == 3, again.stderr
    listed = run_cli(dsn, "schedule", "list", "-o", "json")
    assert [s["name"] for s in json.loads(listed.stdout)] == ["nightly"]
    assert run_cli(dsn, "schedule", "pause", "nightly").returncode == 0
    shown = json.loads(run_cli(dsn, "schedule", "show", "nightly", "-o", "json").stdout)
    assert shown["paused"] is True and shown["next_tick_at"] is None
    resumed = json.loads(run_cli(dsn, "schedule", "resume", "nightly").stdout)
    assert resumed["paused"] is False and resumed["next_tick_at"]
    assert run_cli(dsn, "schedule", "delete", "nightly").returncode == 0
    assert run_cli(dsn, "schedule", "show", "nightly").returncode == 5
    with connect(dsn) as conn:
        who = conn.execute("SELECT action, actor FROM control_events ORDER BY event_id")
        assert [r["action"] for r in who] == ["schedule_add", "schedule_pause",
                                             "schedule_resume", "schedule_delete"]


@pytest.mark.parametrize("args, why", [
    (("--cron", "0 0 30 2 *"), "day-of-month"),          # never fires
    (("--cron", "61 * * * *"), "minute"),
    (("--cron", "* * * *"), "five fields"),
    (("--cron", "0 0 * * * *"), "five fields"),           # seconds: not cron
    (("--cron", "* * * * *", "--timezone", "Mars/Olympus"), "time zone"),
    (("--cron", "* * * * *", "--timezone", "../../etc/passwd"), "time zone"),
])
def test_bad_schedules_write_nothing(dsn: str, spec_file: Path, args: tuple[str, ...],
                                     why: str) -> None:
    before = counts(dsn)
    r = run_cli(dsn, "schedule", "add", "bad", *args, "--spec", str(spec_file))
    assert r.returncode == 2 and why in r.stderr, r.stderr
    assert counts(dsn) == before


@pytest.mark.parametrize("spec, why", [
    ('{"actions": [{"name": "nope"}]}', "nope"),
    ('{"actions": [{"name": "sleep"}], "after": ["01a20000-0000-7000-8000-000000000000"]}',
     "after"),
    ('{"actions": [{"name": "sleep"}], "idempotency_key": "k"}', "idempotency"),
    ('[{"actions": [{"name": "sleep"}]}, {"actions": [{"name": "sleep"}]}]', "one job"),
])
def test_bad_specs_write_nothing(dsn: str, tmp_path: Path, spec: str, why: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(spec)
    before = counts(dsn)
    r = run_cli(dsn, "schedule", "add", "bad", "--cron", "* * * * *", "--spec", str(path))
    assert r.returncode == 2 and why in r.stderr, r.stderr
    assert counts(dsn) == before


def test_the_pass_as_the_maintainer_enqueues_each_tick_once(dsn: str,
                                                            spec_file: Path) -> None:
    for name in ("a", "b", "c"):
        assert run_cli(dsn, "schedule", "add", name, "--cron", "* * * * *", "--spec",
                       str(spec_file)).returncode == 0
    with connect(dsn) as conn:  # make their first tick due now
        conn.execute("UPDATE schedules SET next_tick_at = date_trunc('minute', now())")
    procs = [subprocess.Popen([*JOBFENCE, "schedules"], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=cli_env(dsn, "schedules", **extra))
             for extra in ({}, {}, {"JOBFENCE_TRIGGERED_BY": "alice",
                                    "JOBFENCE_TRIGGER_REASON": "by hand"})]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    reports = [json.loads(o) for o, _ in outs]
    assert sum(r.get("enqueued", 0) for r in reports) == 3
    assert SECRET not in "".join(o + e for o, e in outs)
    with connect(dsn) as conn:
        keys = conn.execute("SELECT idempotency_key, count(*) AS n FROM jobs GROUP BY 1")
        assert sorted(r["n"] for r in keys) == [1, 1, 1]


def failed_jobs(dsn: str, n: int) -> list[str]:
    ids = [enqueue(dsn, f"command:{CMD}", "--label", "batch=x") for _ in range(n)]
    with connect(dsn) as conn:
        conn.execute("UPDATE jobs SET status = 'failed', finished_at = now() "
                     "WHERE job_id = ANY(%s::uuid[])", (ids,))
    return ids


def test_bulk_retry_dry_run_limit_and_yes(dsn: str) -> None:
    ids = failed_jobs(dsn, 5)
    dry = run_cli(dsn, "retry", "--status", "failed", "--label", "batch=x", "--dry-run")
    assert dry.returncode == 0 and "would retry 5 jobs" in dry.stdout, dry.stderr
    assert all(i in dry.stdout for i in ids)
    past = run_cli(dsn, "retry", "--status", "failed", "--limit", "3")
    assert past.returncode == 2 and "--yes" in past.stderr, past.stderr
    with connect(dsn) as conn:
        n = conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'failed'").fetchone()
        assert n == {"n": 5}
    r = run_cli(dsn, "retry", "--status", "failed", "--limit", "3", "--yes", "-o", "json",
                "--reason", "nightly")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["retried"] == 5
    with connect(dsn) as conn:
        rows = conn.execute("SELECT reason FROM job_events WHERE to_status = 'pending' "
                            "AND from_status = 'failed'").fetchall()
    assert len(rows) == 5 and all(r["reason"].startswith("retried by ")
                                  and r["reason"].endswith("(bulk): nightly") for r in rows)
    cancel = run_cli(dsn, "cancel", "--status", "pending", "--label", "batch=x")
    assert cancel.returncode == 0 and "cancelled 5 of 5" in cancel.stdout, cancel.stderr
    bad = run_cli(dsn, "retry", "--status", "running")
    assert bad.returncode == 2


def test_status_and_list_show_what_a_job_runs_with_env_masked(dsn: str) -> None:
    job_id = enqueue(dsn, f"command:{CMD}")
    r = run_cli(dsn, "status", job_id, "-o", "json")
    view = json.loads(r.stdout)
    assert view["actions"][0]["params"] == {"argv": ["sh", "-c", "echo hi; exit 3"],
                                            "env": {"API_TOKEN": "<masked>"}}
    text = run_cli(dsn, "status", job_id)
    assert "argv: sh -c 'echo hi; exit 3'" in text.stdout
    assert "API_TOKEN (values masked)" in text.stdout
    listed = run_cli(dsn, "list")
    assert "sh -c 'echo hi; exit 3'" in listed.stdout
    worker = run_cli(dsn, "worker", JOBFENCE_LOG_LEVEL="debug")
    for out in (r, text, listed, worker):
        assert SECRET not in out.stdout + out.stderr
    # `status` runs as the reader, which may not ask: an operator's login may.
    reader = run_cli(dsn, "status", job_id, "--reveal-env")
    assert reader.returncode != 0 and SECRET not in reader.stdout + reader.stderr
    operator = cli_env(dsn, "cancel")["JOBFENCE_DATABASE_URL"]
    shown = run_cli(dsn, "status", job_id, "--reveal-env", "--reason", "debugging", "-o",
                    "json", JOBFENCE_DATABASE_URL=operator)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["actions"][0]["params"]["env"] == {"API_TOKEN": SECRET}
    assert SECRET not in shown.stderr
    with connect(dsn) as conn:
        audit = conn.execute("SELECT action, subject, detail FROM control_events").fetchall()
    assert [(a["action"], a["subject"], a["detail"]["reason"]) for a in audit] == [
        ("env_revealed", job_id, "debugging")]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion(dsn: str, shell: str) -> None:
    r = run_cli(dsn, "completion", shell)
    assert r.returncode == 0, r.stderr
    assert "schedule" in r.stdout
    assert ("-l dry-run" if shell == "fish" else "--dry-run") in r.stdout
    if shell == "bash":
        check = subprocess.run(
            ["bash", "-c", 'eval "$(cat)"; COMP_WORDS=(jobfence retry --st); COMP_CWORD=2; '
             '_jobfence; echo "${COMPREPLY[@]}"'], input=r.stdout, text=True, check=False,
            capture_output=True)
        assert check.returncode == 0 and check.stdout.split() == ["--status"], check
