"""What an operator needs from the CLI beside the basics: `--version`, `retry` of a failed or
cancelled job (a new attempt budget, audited), `list` paging through any number of jobs,
`status` showing each action's result (exit code, output tails, outputs)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from devtools.sqlconn import connect
from tests.support import REPO, run_cli
from tests.support.procs import FAST, enqueue, events, job


def test_version(dsn: str) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for flag in ("--version", "-V"):
        r = run_cli(dsn, flag)
        assert (r.returncode, r.stdout.strip()) == (0, f"jobfence {version}"), r.stderr


def test_retry_runs_a_failed_job_again_with_a_new_budget(dsn: str, tmp_path: Path) -> None:
    mark = tmp_path / "failed-once"
    flaky = json.dumps({"argv": ["sh", "-c", f"test -e {mark} || {{ touch {mark}; exit 1; }}"]})
    job_id = enqueue(dsn, f"command:{flaky}", "--max-attempts", "1", "--resource", "db.t")
    assert run_cli(dsn, "worker", **FAST).returncode == 1
    assert job(dsn, job_id)["status"] == "failed"
    # Its resource is free again only while nothing else holds it.
    other = enqueue(dsn, 'sleep:{"seconds": 0}', "--resource", "db.t")
    busy = run_cli(dsn, "retry", job_id)
    assert busy.returncode == 3 and "db.t" in busy.stderr, busy.stderr
    assert run_cli(dsn, "cancel", other).returncode == 0
    assert run_cli(dsn, "drain", "on").returncode == 0
    assert run_cli(dsn, "retry", job_id).returncode == 4
    assert run_cli(dsn, "drain", "off").returncode == 0
    r = run_cli(dsn, "retry", job_id, "--reason", "fixed the input")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"job_id": job_id, "status": "pending"}
    row = job(dsn, job_id)
    assert (row["status"], row["attempt_count"], row["error"]) == ("pending", 0, None)
    assert run_cli(dsn, "worker", **FAST).returncode == 0
    assert job(dsn, job_id)["status"] == "succeeded"
    trail = [(e["from_status"], e["to_status"], e["reason"]) for e in events(dsn, job_id)]
    assert ("failed", "pending", "fixed the input") in trail
    assert trail[-1][1] == "succeeded"
    # Only failed or cancelled jobs: a succeeded one, an unknown one, a malformed id.
    done = run_cli(dsn, "retry", job_id)
    assert done.returncode == 3 and "only a failed or cancelled job" in done.stderr
    assert run_cli(dsn, "retry", "01a20000-0000-7000-8000-000000000000").returncode == 5
    assert run_cli(dsn, "retry", "nope").returncode == 2
    # A cancelled job can be retried too.
    assert run_cli(dsn, "retry", other).returncode == 0
    assert job(dsn, other)["status"] == "pending"


def test_list_pages_through_every_job_once(dsn: str) -> None:
    spec = json.dumps([{"actions": [{"name": "sleep", "params": {"seconds": 0}}]}] * 25)
    r = run_cli(dsn, "enqueue", "--spec", "-", input=spec)
    assert r.returncode == 0, r.stderr
    created = [json.loads(line)["job_id"] for line in r.stdout.splitlines()]
    seen: list[str] = []
    after: list[str] = []
    while True:
        page = json.loads(run_cli(dsn, "list", "--limit", "10", "-o", "json", *after).stdout)
        seen += [v["job_id"] for v in page]
        if len(page) < 10:
            break
        after = ["--after", page[-1]["job_id"]]
    assert seen == sorted(created, reverse=True)  # newest first, each once
    text = run_cli(dsn, "list", "--limit", "10").stdout
    assert f"(more: --after {seen[9]})" in text
    assert run_cli(dsn, "list", "--after", "nope").returncode == 2


def test_list_by_label(dsn: str) -> None:
    mine = enqueue(dsn, 'sleep:{"seconds": 0}', "--label", "team=data", "--label", "day=mon")
    enqueue(dsn, 'sleep:{"seconds": 0}', "--label", "team=data")
    enqueue(dsn, 'sleep:{"seconds": 0}', "--label", "team=web")

    def listed(*labels: str) -> list[str]:
        args = [a for label in labels for a in ("--label", label)]
        r = run_cli(dsn, "list", "-o", "json", *args)
        assert r.returncode == 0, r.stderr
        return [v["job_id"] for v in json.loads(r.stdout)]

    assert len(listed("team=data")) == 2
    assert listed("team=data", "day=mon") == [mine]
    assert listed("team=nobody") == []
    assert run_cli(dsn, "list", "--label", "novalue").returncode == 2


def test_status_shows_each_actions_result(dsn: str) -> None:
    ok = json.dumps({"argv": ["sh", "-c", "echo hello; echo warn >&2"]})
    bad = json.dumps({"argv": ["sh", "-c", "echo broken input >&2; exit 3"]})
    job_id = enqueue(dsn, f"command:{ok}", f"command:{bad}", "--max-attempts", "1")
    assert run_cli(dsn, "worker", **FAST).returncode == 1
    view = json.loads(run_cli(dsn, "status", job_id, "-o", "json").stdout)
    first, second = view["actions"]
    assert first["status"] == "succeeded" and first["result"]["exit_code"] == 0
    assert first["result"]["stdout_tail"] == "hello\n"
    assert first["result"]["stderr_tail"] == "warn\n"
    assert second["status"] == "failed" and second["error"] == "command exited with 3: broken input"
    assert second["error_detail"] == "broken input\n"
    text = run_cli(dsn, "status", job_id).stdout
    assert "1. command      succeeded (exit 0)" in text
    assert "stdout | hello" in text and "stderr | broken input" in text
    with connect(dsn) as conn:  # what status shows is what was recorded
        rows = conn.execute("SELECT count(*) AS n FROM job_action_results WHERE job_id = %s",
                            (job_id,)).fetchone()
    assert rows["n"] == 2
