"""Operating an installation through `jobfence serve` over real HTTP: retry and cancel a
selection in one request with a count back (a dry run first, the limit as the confirmed
count, a reader refused), what a job runs with its env values masked (the values only for an
operator who says why, audited, never in the server's log), schedules added, paused, resumed
and deleted, and the queue page's minutes and warnings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.sqlconn import connect
from tests.support.procs import enqueue
from tests.support.serving import Served, serve

PROXY = {"JOBFENCE_AUTH": "proxy", "JOBFENCE_AUTH_READERS": "*",
         "JOBFENCE_AUTH_OPERATORS": "alice"}
ALICE = {"X-Forwarded-User": "alice"}
BOB = {"X-Forwarded-User": "bob"}
SECRET = "tok-3f9c-never-shown"
CMD = json.dumps({"argv": ["echo", "hi"], "env": {"API_TOKEN": SECRET}})


@pytest.fixture
def server(dsn: str, tmp_path: Path) -> Iterator[Served]:
    with serve(dsn, **PROXY, TMPDIR=str(tmp_path)) as s:
        yield s


def failed(dsn: str, n: int) -> list[str]:
    ids = [enqueue(dsn, f"command:{CMD}", "--queue", "reports") for _ in range(n)]
    with connect(dsn) as conn:
        conn.execute("UPDATE jobs SET status = 'failed', finished_at = now() "
                     "WHERE job_id = ANY(%s::uuid[])", (ids,))
    return ids


def test_bulk_retry_dry_run_then_the_confirmed_count(server: Served, dsn: str) -> None:
    failed(dsn, 7)
    sel = {"status": "failed", "queue": "reports"}
    dry = server.post("/api/v1/jobs/retry", {**sel, "dry_run": True}, headers=ALICE)
    assert dry.status == 200 and (dry.body["matched"], len(dry.body["job_ids"])) == (7, 7)
    assert server.post("/api/v1/jobs/retry", sel, headers=BOB).status == 403
    over = server.post("/api/v1/jobs/retry", {**sel, "limit": 5}, headers=ALICE)
    assert over.status == 409 and '"limit": 7' in over.body["error"]
    done = server.post("/api/v1/jobs/retry", {**sel, "limit": 7, "reason": "nightly"},
                       headers=ALICE)
    assert done.status == 200 and done.body["retried"] == 7, done.body
    with connect(dsn) as conn:
        reasons = conn.execute("SELECT reason FROM job_events WHERE from_status = 'failed' "
                               "AND to_status = 'pending'").fetchall()
    assert [r["reason"] for r in reasons] == ["retried by alice (bulk): nightly"] * 7
    picked = server.post("/api/v1/jobs/cancel", {"job_ids": [j for j in
                                                             dry.body["job_ids"][:2]]},
                         headers=ALICE)
    assert picked.status == 200 and picked.body["cancelled"] == 2
    for bad in ({"status": "running"}, {"status": "failed", "before": "yesterday"},
                {"status": "failed", "limit": 0}, {"job_ids": ["nope"]}, {"what": 1}):
        assert server.post("/api/v1/jobs/retry", bad, headers=ALICE).status == 400, bad


def test_a_jobs_params_with_env_masked_and_revealed_on_request(server: Served,
                                                                dsn: str) -> None:
    job_id = enqueue(dsn, f"command:{CMD}")
    page = server.get(f"/api/v1/jobs/{job_id}", headers=BOB)
    assert page.body["actions"][0]["params"] == {"argv": ["echo", "hi"],
                                                 "env": {"API_TOKEN": "<masked>"}}
    listed = server.get("/api/v1/jobs", headers=BOB)
    assert listed.body["jobs"][0]["summary"] == "echo hi"
    assert SECRET not in json.dumps(page.body) + json.dumps(listed.body)
    assert server.post(f"/api/v1/jobs/{job_id}/env", {"reason": "x"}, headers=BOB).status == 403
    assert server.post(f"/api/v1/jobs/{job_id}/env", {}, headers=ALICE).status == 400
    shown = server.post(f"/api/v1/jobs/{job_id}/env", {"reason": "debugging"}, headers=ALICE)
    assert shown.status == 200 and shown.body["actions"] == [
        {"index": 0, "name": "command", "env": {"API_TOKEN": SECRET}}]
    with connect(dsn) as conn:
        audit = conn.execute("SELECT actor, action, detail FROM control_events").fetchall()
    assert [(a["actor"], a["action"], a["detail"]["reason"]) for a in audit] == [
        ("alice", "env_revealed", "debugging")]
    server.proc.terminate()
    _, log = server.proc.communicate(timeout=30)
    assert SECRET not in log


def test_schedules_through_the_api(server: Served, dsn: str) -> None:
    body = {"name": "nightly", "cron": "30 2 * * *", "timezone": "Europe/Riga",
            "spec": {"actions": [{"name": "command", "params": json.loads(CMD)}]}}
    assert server.post("/api/v1/schedules", body, headers=BOB).status == 403
    made = server.post("/api/v1/schedules", body, headers=ALICE)
    assert made.status == 201 and made.headers["location"] == "/api/v1/schedules/nightly"
    assert made.body["spec"]["actions"][0]["params"]["env"] == {"API_TOKEN": "<masked>"}
    assert server.post("/api/v1/schedules", body, headers=ALICE).status == 409
    for bad in ({**body, "name": "x", "cron": "0 0 30 2 *"},
                {**body, "name": "y", "timezone": "Nowhere/Special"},
                {**body, "name": "z", "spec": {"actions": []}}):
        assert server.post("/api/v1/schedules", bad, headers=ALICE).status == 400, bad
    listed = server.get("/api/v1/schedules", headers=BOB).body["schedules"]
    assert [s["name"] for s in listed] == ["nightly"]
    paused = server.post("/api/v1/schedules/nightly/pause", headers=ALICE)
    assert paused.body["paused"] is True
    one = server.get("/api/v1/schedules/nightly", headers=BOB)
    assert one.body["paused"] is True and one.body["ticks"] == []
    assert server.post("/api/v1/schedules/nightly/resume", headers=ALICE).body["paused"] is False
    assert server.post("/api/v1/schedules/nightly/delete", headers=ALICE).status == 200
    assert server.get("/api/v1/schedules/nightly", headers=BOB).status == 404


def test_queue_minutes_and_warnings(server: Served, dsn: str) -> None:
    enqueue(dsn, 'sleep:{"seconds": 0}', "--queue", "nobody-serves-this")
    queues = {q["queue"]: q for q in server.get("/api/v1/queues", headers=BOB).body["queues"]}
    assert queues["nobody-serves-this"]["never_served"] is True
    assert queues["nobody-serves-this"]["stalled"] is False  # not old enough yet
    with connect(dsn) as conn:
        conn.execute("INSERT INTO job_metric_history (minute, queue, name, label, le, value) "
                     "SELECT date_trunc('minute', now()) - interval '2 minutes', 'reports', "
                     "x.name, x.label, x.le, x.value FROM (VALUES "
                     "('finished', 'succeeded', 'Infinity'::float8, 10::float8), "
                     "('wait', '', 1, 10), ('run', '', 5, 8), ('run', '', 10, 2)) "
                     "AS x (name, label, le, value)")
    minutes = server.get("/api/v1/queues/reports/history?minutes=5", headers=BOB).body["minutes"]
    assert len(minutes) == 5
    busy = [m for m in minutes if m["claims"]]
    assert len(busy) == 1 and busy[0]["finished"] == {"succeeded": 10}
    assert 1 <= busy[0]["run_p50"] <= 5 and 5 <= busy[0]["run_p95"] <= 10
    assert server.get("/api/v1/queues/reports/history?minutes=0", headers=BOB).status == 400
