"""Every answer of the API within its documented bound, through a real ``jobfence serve``:
a job of many actions with large results, a page of such jobs, an attempt's output of many
large streams on S3 (moto's server), a list of large schedules — each answer at most its
bound, and the rest reached, byte for byte, by following its links."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobfence.console.bounds import (
    ANSWER_BYTES,
    LISTED_JOB_BYTES,
    LISTED_SCHEDULE_BYTES,
    LOG_ANSWER_BYTES,
)
from jobfence.schedules import job_template, schedule_spec
from jobfence.store import ActionOutcome, Store
from tests.support import run_cli
from tests.support.procs import enqueue
from tests.support.serving import Reply, Served, serve

ACTIONS = 40
TAIL = "é\x1b[2J" + "x" * 200_000  # escapes and a two-byte character: JSON is larger


def _sent(r: Reply) -> int:
    assert r.status == 200, r.body
    return int(r.headers["content-length"])


def _ran(store: Store, job_id: str) -> None:
    """A claim whose every action left a large result (a plugin's result may be 256 KiB):
    written through the fenced verbs, as a worker writes them."""
    [claim] = store.attempts.claim(worker_id="test", lease_seconds=300)
    assert str(claim.job_id) == job_id
    for i in range(ACTIONS):
        assert store.attempts.record_action(
            job_id=claim.job_id, attempt_id=claim.attempt_id, outcome=ActionOutcome(
                i, "sleep", True, datetime.now(UTC), {"stdout_tail": f"{i}:{TAIL}"}))
    assert store.attempts.finish(job_id=claim.job_id, attempt_id=claim.attempt_id,
                                 succeeded=True) is not None


def _follow_actions(server: Served, job: dict[str, Any]) -> list[dict[str, Any]]:
    """A job's actions whole: those its page answered whole, then the rest by its link."""
    whole = [a for a in job["actions"] if not a.get("cut")]
    link = job.get("actions_next")
    while link:
        r = server.get(link)
        assert _sent(r) <= ANSWER_BYTES
        assert [a["index"] for a in r.body["actions"]] == list(
            range(len(whole), len(whole) + len(r.body["actions"])))
        whole += [{k: v for k, v in a.items() if k != "index"} for a in r.body["actions"]]
        link = r.body["next"]
    return whole


def test_jobs_of_many_large_actions_are_answered_within_the_bound(
        dsn: str, store: Store, tmp_path: Path) -> None:
    spec = json.dumps({"actions": [{"name": "sleep", "params": {"seconds": 1}}] * ACTIONS})
    (tmp_path / "spec.json").write_text(spec)
    ids = []
    for _ in range(3):  # 3 jobs of 40 actions of 200 KB: 24 MB of results
        ids.append(enqueue(dsn, "--spec", str(tmp_path / "spec.json")))
        _ran(store, ids[-1])
    with serve(dsn, JOBFENCE_AUTH="none", TMPDIR=str(tmp_path)) as server:
        r = server.get(f"/api/v1/jobs/{ids[0]}")
        assert _sent(r) <= ANSWER_BYTES
        job = r.body
        assert 0 < sum(1 for a in job["actions"] if not a.get("cut")) < ACTIONS
        assert [a["status"] for a in job["actions"]] == ["succeeded"] * ACTIONS
        actions = _follow_actions(server, job)
        assert [a["result"]["stdout_tail"] for a in actions] == [
            f"{i}:{TAIL}" for i in range(ACTIONS)]
        assert job["events"][-1]["to_status"] == "succeeded"

        seen: list[str] = []
        link: str | None = "/api/v1/jobs?limit=500"
        while link:
            r = server.get(link)
            assert _sent(r) <= ANSWER_BYTES
            for listed in r.body["jobs"]:
                assert len(json.dumps(listed, ensure_ascii=False,
                                      separators=(",", ":")).encode()) <= LISTED_JOB_BYTES
                assert len(listed["actions"]) == ACTIONS and listed["actions_next"]
            seen += [j["job_id"] for j in r.body["jobs"]]
            link = r.body["next"]
        assert sorted(seen) == sorted(ids)
        refused = server.get(f"/api/v1/jobs/{ids[0]}/actions?from=x")
        assert refused.status == 400


def test_an_attempts_large_output_comes_in_bounded_pages(
        dsn: str, tmp_path: Path, s3_env: dict[str, str]) -> None:
    """Six actions each writing 1.5 MiB to stdout and 300 KB to stderr, kept whole on S3:
    every answer of GET /jobs/ID/logs at most LOG_ANSWER_BYTES, and the streams whole, in
    order, by following ``next``; one stream alone with ``only``."""
    script = ("import sys\nn = int(sys.argv[1])\n"
              "sys.stdout.write(''.join(f'{n}:{i:07d}\\x1b é\\n' for i in range(120_000)))\n"
              "sys.stderr.write(f'{n}' + 'e' * 300_000)\n")
    actions = [{"name": "command", "params": {"argv": [sys.executable, "-c", script, str(n)]}}
               for n in range(6)]
    (tmp_path / "spec.json").write_text(json.dumps({"actions": actions}))
    job_id = enqueue(dsn, "--spec", str(tmp_path / "spec.json"), **s3_env)
    assert run_cli(dsn, "worker", "--max-jobs", "1", **s3_env).returncode == 0
    expected = {(n, "stdout"): "".join(f"{n}:{i:07d}\x1b é\n" for i in range(120_000))
                for n in range(6)}
    expected |= {(n, "stderr"): f"{n}" + "e" * 300_000 for n in range(6)}
    with serve(dsn, JOBFENCE_AUTH="none", TMPDIR=str(tmp_path), **s3_env) as server:
        got: dict[tuple[int, str], str] = {}
        link: str | None = f"/api/v1/jobs/{job_id}/logs"
        pages = 0
        while link:
            r = server.get(link)
            assert _sent(r) <= LOG_ANSWER_BYTES
            pages += 1
            for p in r.body["pieces"]:
                key = (p["action"], p["stream"])
                text = got.get(key, "")
                assert len(text.encode()) == p["offset"]  # each page goes on where one ended
                got[key] = text + p["text"]
            link = r.body["next"]
        assert got == expected
        assert pages >= 12  # 11.7 MB, escapes counted
        r = server.get(f"/api/v1/jobs/{job_id}/logs?action=4&stream=stderr&only=true")
        assert _sent(r) <= LOG_ANSWER_BYTES
        [piece] = r.body["pieces"]
        assert (piece["action"], piece["stream"], piece["whole"]) == (4, "stderr", True)
        assert piece["text"] == expected[(4, "stderr")] and r.body["next"] is None
        assert server.get(f"/api/v1/jobs/{job_id}/logs?action=9").status == 404


def test_schedules_are_listed_in_bounded_pages(dsn: str, store: Store,
                                               tmp_path: Path) -> None:
    """Thirty schedules each running a 200 KB argv (6 MB in all), and one of 300 KB: a
    page at most ANSWER_BYTES, each schedule of it within LISTED_SCHEDULE_BYTES (the large
    one's actions by name, whole at its own route), every one reached by ``next``."""
    def add(name: str, argv: list[str]) -> None:
        spec, shown = schedule_spec({"actions": [{"name": "command",
                                                  "params": {"argv": argv}}]})
        store.schedules.add(name=name, cron="0 * * * *", timezone="UTC", spec=shown,
                            job=job_template(spec, name, 3),
                            next_tick_at=datetime(2030, 1, 1, tzinfo=UTC), actor="test")

    for n in range(30):
        add(f"big-{n:02d}", ["echo", *["y" * 50_000] * 4])
    huge = ["echo", *["z" * 50_000] * 6]
    add("huge", huge)
    with serve(dsn, JOBFENCE_AUTH="none", TMPDIR=str(tmp_path)) as server:
        names: list[str] = []
        link: str | None = "/api/v1/schedules?limit=500"
        pages = 0
        while link:
            r = server.get(link)
            assert _sent(r) <= ANSWER_BYTES
            pages += 1
            for s in r.body["schedules"]:
                assert len(json.dumps(s, separators=(",", ":")).encode()) \
                    <= LISTED_SCHEDULE_BYTES
                assert ("spec_cut" in s) == (s["name"] == "huge")
            names += [s["name"] for s in r.body["schedules"]]
            link = r.body["next"]
        assert names == [*(f"big-{n:02d}" for n in range(30)), "huge"] and pages >= 2
        one = server.get("/api/v1/schedules/huge")
        assert _sent(one) <= ANSWER_BYTES and "spec_cut" not in one.body
        assert one.body["spec"]["actions"][0]["params"]["argv"] == huge
