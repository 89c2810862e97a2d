"""`jobfence serve` over real HTTP: a server started by the test on 127.0.0.1 against a real
PostgreSQL, called the way a client calls it. Every status code the API promises, who may
do what (no token, a reader, an operator), CSRF refusals, the manual trigger's rate limit
and its audit row (raced), and paging through 25,000 jobs with the server's memory bounded.
Real bearer tokens and a trigger through the Kubernetes API (a Job from the CronJob) are in
tests/cluster/test_console.py, on the real control plane."""

from __future__ import annotations

import json
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict
from starlette.routing import Route

from devtools.sqlconn import connect
from tests.support import role_dsn, run_cli
from tests.support.procs import FAST, enqueue
from tests.support.serving import Served, free_port, serve

PROXY = {"JOBFENCE_AUTH": "proxy", "JOBFENCE_AUTH_READERS": "*",
         "JOBFENCE_AUTH_OPERATORS": "alice,group:oncall", "JOBFENCE_CLUSTER": "local"}
ALICE = {"X-Forwarded-User": "alice"}
BOB = {"X-Forwarded-User": "bob", "X-Forwarded-Groups": "dev"}
CAROL = {"X-Forwarded-User": "carol", "X-Forwarded-Groups": "dev, oncall"}


@pytest.fixture
def server(dsn: str, tmp_path: Path) -> Iterator[Served]:
    with serve(dsn, **PROXY, TMPDIR=str(tmp_path),
               JOBFENCE_LOCAL_FUNCTIONS_DATABASE_URL=role_dsn(dsn, "sweeper")) as s:
        yield s


def spec(**kw: object) -> dict[str, object]:
    return {"actions": [{"name": "sleep", "params": {"seconds": 0}}], **kw}


@pytest.mark.pooled  # directly and through PgBouncer in transaction mode
def test_submit_get_list_cancel_and_retry(server: Served, dsn: str) -> None:
    r = server.post("/api/v1/jobs", spec(resource="db.a", labels={"team": "x"}),
                    headers=ALICE)
    assert r.status == 202, r.body
    job_id = r.body["job_id"]
    assert r.headers["location"] == f"/api/v1/jobs/{job_id}"
    assert r.body["status"] == "pending"
    assert re.fullmatch(r"app;dur=[0-9.]+", r.headers["server-timing"])

    got = server.get(f"/api/v1/jobs/{job_id}", headers=BOB)
    assert got.status == 200
    cli = json.loads(run_cli(dsn, "status", job_id, "-o", "json").stdout)
    assert {k: got.body[k] for k in cli} == cli  # the `status -o json` object, and more
    assert got.body["events"][0]["to_status"] == "pending" and got.body["attempts"] == []

    listed = server.get("/api/v1/jobs?label=team=x&status=pending", headers=BOB)
    assert [j["job_id"] for j in listed.body["jobs"]] == [job_id]
    assert server.get("/api/v1/jobs?label=team=y", headers=BOB).body["jobs"] == []

    busy = server.post("/api/v1/jobs", spec(resource="db.a"), headers=ALICE)
    assert busy.status == 409 and "db.a" in busy.body["error"]

    cancelled = server.post(f"/api/v1/jobs/{job_id}/cancel", {"reason": "wrong table"},
                            headers=CAROL)
    assert cancelled.status == 200 and cancelled.body["status"] == "cancelled"
    trail = server.get(f"/api/v1/jobs/{job_id}", headers=BOB).body["events"]
    assert trail[-1]["reason"] == "cancelled by carol: wrong table"
    assert server.post(f"/api/v1/jobs/{job_id}/cancel", headers=ALICE).status == 409

    retried = server.post(f"/api/v1/jobs/{job_id}/retry", headers=ALICE)
    assert retried.body == {"job_id": job_id, "status": "pending"}
    assert server.post(f"/api/v1/jobs/{job_id}/retry", headers=ALICE).status == 409
    assert run_cli(dsn, "worker", **FAST).returncode == 0
    done = server.get(f"/api/v1/jobs/{job_id}", headers=BOB).body
    assert done["status"] == "succeeded"
    [attempt] = done["attempts"]
    assert attempt["outcome"] == "succeeded" and attempt["claimed_by"]


def test_a_list_of_specs_is_all_or_nothing(server: Served, dsn: str) -> None:
    r = server.post("/api/v1/jobs", [spec(), spec(resource="db.b")], headers=ALICE)
    assert r.status == 202 and len(r.body) == 2
    bad = server.post("/api/v1/jobs", [spec(), spec(max_attempts=0)], headers=ALICE)
    assert bad.status == 400
    cli = run_cli(dsn, "enqueue", "--spec", "-",
                  input=json.dumps([spec(), spec(max_attempts=0)]))
    assert cli.returncode == 2 and bad.body["error"] in cli.stderr  # the CLI's message
    assert len(server.get("/api/v1/jobs", headers=BOB).body["jobs"]) == 2


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("GET", "/api/v1/jobs/not-a-uuid", None, 400),
    ("GET", "/api/v1/jobs/0190a000-0000-7000-8000-000000000000", None, 404),
    ("POST", "/api/v1/jobs/0190a000-0000-7000-8000-000000000000/cancel", None, 404),
    ("POST", "/api/v1/jobs/0190a000-0000-7000-8000-000000000000/retry", None, 404),
    ("GET", "/api/v1/jobs?limit=501", None, 400),
    ("GET", "/api/v1/jobs?limit=0", None, 400),
    ("GET", "/api/v1/jobs?limit=%C2%B2", None, 400),  # "²" passes str.isdigit
    ("GET", "/api/v1/jobs?limit=5&limit=6", None, 400),
    ("GET", "/api/v1/functions?runs=%C2%B2", None, 400),
    ("GET", "/api/v1/queues?x=1", None, 400),
    ("GET", "/api/v1/jobs?status=done", None, 400),
    ("GET", "/api/v1/jobs?queue=Not_A_Queue", None, 400),
    ("GET", "/api/v1/jobs?label=novalue", None, 400),
    ("GET", "/api/v1/jobs?sort=x", None, 400),
    ("POST", "/api/v1/jobs", {"actions": []}, 400),
    ("POST", "/api/v1/jobs", {"actions": [{"name": "sleep"}], "ttl": "P999999Y"}, 400),
    ("POST", "/api/v1/queues/UPPER/pause", None, 400),
    ("POST", "/api/v1/queues/q/limit", {"limit": -1}, 400),
    ("POST", "/api/v1/drain", {"on": "yes"}, 400),
    ("POST", "/api/v1/functions/nope/trigger", {"reason": "x"}, 404),
    ("POST", "/api/v1/functions/sweeper/trigger", {}, 400),
    ("POST", "/api/v1/jobs", spec(delay="PT1H", expires_in="PT10M"), 400),
])
def test_bad_requests_say_what_is_wrong_and_write_nothing(
        server: Served, dsn: str, method: str, path: str, body: object, status: int) -> None:
    r = server.call(method, path, body, headers=ALICE)
    assert r.status == status, r.body
    assert r.body["error"]
    with connect(dsn) as conn:
        counts = conn.execute("SELECT (SELECT count(*) FROM jobfence.jobs) AS jobs, "
                              "(SELECT count(*) FROM jobfence.queues) AS queues, "
                              "(SELECT count(*) FROM jobfence.function_triggers) AS t"
                              ).fetchone()
    assert counts == {"jobs": 0, "queues": 0, "t": 0}


def test_a_body_that_is_not_json_is_refused(server: Served) -> None:
    r = server.call("POST", "/api/v1/jobs", raw=b"{not json", headers=ALICE)
    assert r.status == 400 and "not JSON" in r.body["error"]
    r = server.call("POST", "/api/v1/jobs", raw=b"\xff\xfe", headers=ALICE)
    assert r.status == 400
    deep = server.call("POST", "/api/v1/jobs", raw=b"[" * 100_000 + b"]" * 100_000,
                       headers=ALICE)
    assert deep.status == 400 and "nested" in deep.body["error"]
    assert server.get("/api/v1/jobs", headers=BOB).body["jobs"] == []


def test_a_trigger_without_a_cluster_is_503_saying_why(dsn: str) -> None:
    with serve(dsn, JOBFENCE_AUTH="none", JOBFENCE_CLUSTER="none") as s:
        r = s.post("/api/v1/functions/sweeper/trigger", {"reason": "INC-9"})
        assert r.status == 503 and "JOBFENCE_CLUSTER" in r.body["error"], r.body
    with connect(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM jobfence.function_triggers"
                            ).fetchone() == {"n": 0}


@pytest.mark.pooled
def test_queues_and_drain(server: Served, dsn: str) -> None:
    enqueue(dsn, 'sleep:{"seconds": 0}', "--queue", "etl")
    paused = server.post("/api/v1/queues/etl/pause", {"reason": "backfill"}, headers=ALICE)
    assert paused.status == 200 and paused.body["paused"] is True
    assert paused.body["pending"] == 1
    assert server.post("/api/v1/queues/etl/limit", {"limit": 2}, headers=ALICE).body[
        "limit"] == 2
    queues = server.get("/api/v1/queues", headers=BOB).body["queues"]
    [etl] = [q for q in queues if q["queue"] == "etl"]
    assert (etl["paused"], etl["limit"], etl["pending"]) == (True, 2, 1)
    cli = json.loads(run_cli(dsn, "queue", "status", "etl", "-o", "json").stdout)
    assert {k: etl[k] for k in cli} == cli
    assert server.post("/api/v1/queues/etl/resume", headers=ALICE).body["paused"] is False

    assert server.get("/api/v1/drain", headers=BOB).body["draining"] is False
    on = server.post("/api/v1/drain", {"on": True, "reason": "upgrade"}, headers=ALICE)
    assert on.status == 200 and on.body["draining"] is True
    assert on.body["reason"] == "drain on by alice: upgrade"
    refused = server.post("/api/v1/jobs", spec(), headers=ALICE)
    assert refused.status == 503 and "drain" in refused.body["error"]
    assert server.post("/api/v1/drain", {"on": False}, headers=ALICE).body["draining"] is False
    assert server.post("/api/v1/jobs", spec(), headers=ALICE).status == 202


@pytest.mark.pooled  # directly and through PgBouncer in transaction mode
def test_workflows_and_groups(server: Served, dsn: str) -> None:
    """A workflow submitted, read, run, failed at a step, retried and cancelled through the
    API (as the CLI sees it), and a queue's groups set and read; a reader may do none of
    the writes, and a bad workflow is a 400 that writes nothing."""
    wf = {"workflow": "etl", "idempotency_key": "etl-1", "steps": {
        "extract": spec(), "load": {**spec(max_attempts=1, actions=[
            {"name": "command", "params": {"argv": ["false"]}}]), "after": ["extract"]},
        "report": {**spec(), "after": ["load"]}}}
    made = server.post("/api/v1/workflows", wf, headers=ALICE)
    assert made.status == 201, made.body
    wid = made.body["workflow_id"]
    assert made.headers["location"] == f"/api/v1/workflows/{wid}"
    again = server.post("/api/v1/workflows", wf, headers=ALICE)
    assert again.status == 200 and again.body["workflow_id"] == wid
    assert again.body["created"] is False
    assert server.post("/api/v1/workflows", {**wf, "idempotency_key": "etl-1", "steps": {
        "x": spec()}}, headers=ALICE).status == 409
    assert run_cli(dsn, "worker", "--max-jobs", "3", "--idle-seconds", "1",
                   **FAST).returncode in (0, 1)
    got = server.get(f"/api/v1/workflows/{wid}", headers=BOB).body
    assert (got["status"], got["failed_step"]) == ("failed", "load")
    cli = json.loads(run_cli(dsn, "workflow", "status", wid, "-o", "json").stdout)
    assert got == cli
    assert [w["workflow_id"] for w in server.get("/api/v1/workflows?name=etl",
                                                 headers=BOB).body["workflows"]] == [wid]
    retried = server.post(f"/api/v1/workflows/{wid}/retry", {"reason": "fixed"},
                          headers=ALICE)
    assert retried.status == 200 and retried.body["status"] == "running"
    assert retried.body["steps"]["extract"]["attempts"] == 1
    cancelled = server.post(f"/api/v1/workflows/{wid}/cancel", headers=CAROL)
    assert cancelled.body["status"] == "cancelled"
    assert "by carol" in cancelled.body["steps"]["report"]["error"]
    for path in ("/api/v1/workflows", f"/api/v1/workflows/{wid}/cancel",
                 f"/api/v1/workflows/{wid}/retry", "/api/v1/queues/q/groups"):
        assert server.post(path, wf, headers=BOB).status == 403, path
    with connect(dsn) as conn:
        before = conn.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"]
        bad = server.post("/api/v1/workflows", {"workflow": "w", "steps": {
            "a": {**spec(), "after": ["b"]}, "b": {**spec(), "after": ["a"]}}},
            headers=ALICE)
        assert bad.status == 400 and "cycle" in bad.body["error"]
        bad = server.post("/api/v1/workflows", {"workflow": "w", "steps": {
            "a": spec(), "b": {**spec(), "inputs": {"steps": ["a"], "per_datum": 0}}}},
            headers=ALICE)
        assert bad.status == 400 and "per_datum" in bad.body["error"]
        assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"] == before
    assert server.get("/api/v1/workflows/nope", headers=BOB).status == 400
    assert server.get("/api/v1/workflows/01a226d7-219f-726e-bc16-f8c4cfd64f5a",
                      headers=BOB).status == 404

    enqueue(dsn, 'sleep:{"seconds": 0}', "--queue", "tenants", "--group", "acme")
    groups = server.post("/api/v1/queues/tenants/groups", {"group_limit": 2, "fair": True},
                         headers=ALICE)
    assert groups.status == 200 and groups.body == {"queue": "tenants", "groups": [
        {"group": "acme", "pending": 1, "scheduled": 0, "running": 0, "waiting": 0}]}
    [q] = [q for q in server.get("/api/v1/queues", headers=BOB).body["queues"]
           if q["queue"] == "tenants"]
    assert (q["group_limit"], q["fair"]) == (2, True)
    assert server.get("/api/v1/queues/tenants/groups", headers=BOB).body == groups.body
    assert server.post("/api/v1/queues/tenants/groups", {"group_limit": -1},
                       headers=ALICE).status == 400


def test_who_may_do_what(server: Served) -> None:
    assert server.get("/api/v1/jobs").status == 401  # no identity: the proxy was bypassed
    assert server.get("/api/v1/me", headers=BOB).body == {
        "user": "bob", "groups": ["dev"], "may_read": True, "may_operate": False,
        "auth": "proxy"}
    assert server.get("/api/v1/me", headers=CAROL).body["may_operate"] is True  # her group
    # A user who chose the name "group:oncall" is not in the group oncall.
    impostor = {"X-Forwarded-User": "group:oncall"}
    assert server.get("/api/v1/me", headers=impostor).body["may_operate"] is False
    assert server.post("/api/v1/drain", {"on": True}, headers=impostor).status == 403
    for path in ("/api/v1/jobs", "/api/v1/queues/q/pause", "/api/v1/queues/q/resume",
                 "/api/v1/queues/q/limit", "/api/v1/drain",
                 "/api/v1/functions/sweeper/trigger",
                 "/api/v1/jobs/0190a000-0000-7000-8000-000000000000/cancel",
                 "/api/v1/jobs/0190a000-0000-7000-8000-000000000000/retry"):
        r = server.post(path, {"reason": "x", **spec()}, headers=BOB)
        assert r.status == 403, (path, r.body)
    for path in ("/api/v1/jobs", "/api/v1/queues", "/api/v1/drain", "/api/v1/functions"):
        assert server.get(path, headers=BOB).status == 200
    # Health, readiness and the page itself hold no data and need no identity.
    assert server.get("/healthz").status == 200
    assert server.get("/readyz").body == {"ready": True}


def test_writes_a_browser_may_be_tricked_into_are_refused(server: Served) -> None:
    form = server.call("POST", "/api/v1/drain", raw=b"on=true", headers={
        **ALICE, "Content-Type": "application/x-www-form-urlencoded"})
    assert form.status == 403 and "application/json" in form.body["error"]
    plain = server.call("POST", "/api/v1/drain", raw=b'{"on": true}', headers={
        **ALICE, "Content-Type": "text/plain"})
    assert plain.status == 403
    elsewhere = server.post("/api/v1/drain", {"on": True},
                            headers={**ALICE, "Origin": "https://evil.example"})
    assert elsewhere.status == 403
    cross = server.post("/api/v1/drain", {"on": True},
                        headers={**ALICE, "Sec-Fetch-Site": "cross-site"})
    assert cross.status == 403
    same = server.post("/api/v1/drain", {"on": False}, headers={
        **ALICE, "Origin": server.url, "Sec-Fetch-Site": "same-origin"})
    assert same.status == 200 and same.body["draining"] is False
    page = server.get("/")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_the_openapi_document_names_every_route(server: Served) -> None:
    from openapi_spec_validator import validate

    doc = server.get("/api/v1/openapi.json").body
    assert doc["openapi"].startswith("3.1")
    validate(doc)  # a valid OpenAPI 3.1 document
    documented = {(path, method.upper()) for path, ops in doc["paths"].items()
                  for method in ops}
    served = set()
    for route in _routes():
        if route.path.startswith("/api/v1/") and route.path != "/api/v1/openapi.json":
            served |= {(route.path, m) for m in route.methods or () if m != "HEAD"}
    assert documented == served


def _routes() -> list[Route]:
    from jobfence.console.api import Server
    from jobfence.settings import load_settings

    settings = load_settings(database_url="dbname=x", auth="none")
    server = Server(settings, pool=None, auth=None, cluster=None)  # type: ignore[arg-type]
    return [r for r in server.app().routes if isinstance(r, Route)]


def test_manual_trigger_is_rate_limited_raced_and_audited(server: Served, dsn: str) -> None:
    results: list[int] = []
    start = threading.Barrier(12)

    def trigger(i: int) -> None:
        start.wait()
        r = server.post("/api/v1/functions/sweeper/trigger", {"reason": f"INC-{i}"},
                        headers=ALICE)
        results.append(r.status)
        if r.status == 429:
            assert 1 <= int(r.headers["retry-after"]) <= 60

    threads = [threading.Thread(target=trigger, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [202] + [429] * 11
    with connect(dsn) as conn:
        rows = conn.execute("SELECT function, requested_by, reason, outcome, job_name "
                            "FROM jobfence.function_triggers").fetchall()
    [(function, by, reason, outcome, name)] = [tuple(r.values()) for r in rows]
    assert (function, by, outcome) == ("sweeper", "alice", "created")
    assert reason.startswith("INC-") and name.startswith("local-sweeper-")
    # Another function has its own slot; the run records who started it and why.
    assert server.post("/api/v1/functions/lifecycle/trigger", {"reason": "check"},
                       headers=ALICE).status == 202
    functions = server.get("/api/v1/functions", headers=BOB).body
    assert [t["function"] for t in functions["triggers"]] == ["lifecycle", "sweeper"]

    def ran() -> list[tuple[str, str, str]]:
        with connect(dsn) as conn:
            return [tuple(r.values()) for r in conn.execute(
                "SELECT function, trigger, triggered_by FROM jobfence.function_runs "
                "ORDER BY run_id").fetchall()]
    from tests.support.procs import wait_for
    runs = wait_for(lambda: len(ran()) == 2 and ran(), timeout=60)
    assert sorted(runs) == [("lifecycle", "manual", "alice"), ("sweeper", "manual", "alice")]


def test_no_auth_only_on_loopback_and_only_for_loopback_hosts(dsn: str) -> None:
    r = run_cli(dsn, "serve", "--host", "0.0.0.0", "--port", str(free_port()),
                JOBFENCE_AUTH="none")
    assert r.returncode == 2 and "loopback" in r.stderr
    with serve(dsn, JOBFENCE_AUTH="none") as s:
        assert s.get("/api/v1/me").body["may_operate"] is True
        rebound = s.get("/api/v1/me", headers={"Host": "attacker.example:8080"})
        assert rebound.status == 403


def test_sigterm_stops_it_cleanly(dsn: str) -> None:
    with serve(dsn, JOBFENCE_AUTH="none") as s:
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=30) == 0


def test_paging_through_25000_jobs_keeps_the_server_small(server: Served, dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute("""
            INSERT INTO jobfence.jobs (job_id, status, actions, max_attempts, attempt_count,
                                       finished_at, labels)
            SELECT gen_random_uuid(), 'succeeded', '[{"name": "sleep", "params": {}}]', 3, 1,
                   now(), jsonb_build_object('n', i::text)
            FROM generate_series(1, 25000) i""")
    rss = []
    seen: set[str] = set()
    path: str | None = "/api/v1/jobs?limit=500&status=succeeded"
    pages = 0
    while path:
        r = server.get(path, headers=BOB)
        assert r.status == 200
        seen.update(j["job_id"] for j in r.body["jobs"])
        path = r.body["next"]
        pages += 1
        rss.append(_rss_kib(server.proc.pid))
    assert len(seen) == 25_000 and pages == 51  # the last page is empty
    # Memory after the first pages is what it stays: nothing accumulates per page.
    assert max(rss[10:]) - rss[9] < 20 * 1024, rss


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    """The resident memory of a process (``VmHWM``: the most it ever had)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def test_a_chunked_body_of_512_mib_is_refused_while_it_streams_and_the_server_stays_small(
        server: Served, dsn: str) -> None:
    mib = 1024 * 1024
    before = _rss_kib(server.proc.pid)
    body = (b" " * mib for _ in range(512))  # made as it is sent, never held whole
    r, sent = server.post_chunked("/api/v1/jobs", body, headers=ALICE)
    grew = (_rss_kib(server.proc.pid, "VmHWM") - before) * 1024
    assert grew < 128 * mib, f"the server grew by {grew // mib} MiB at its peak"
    assert r.status == 413 and "larger than" in r.body["error"], (r.status, r.body)
    assert sent < 512 * mib  # refused before the end: the client stopped sending
    # A body that declares more than the limit is refused before a byte of it is read.
    declared = server.call("POST", "/api/v1/jobs", raw=b"{}", headers={
        **ALICE, "Content-Length": str(65 * mib)})
    assert declared.status == 413
    assert server.get("/api/v1/jobs", headers=BOB).body["jobs"] == []


def test_the_cli_knows_serve(dsn: str) -> None:
    r = run_cli(dsn, "serve", "--help")
    assert r.returncode == 0 and "--port" in r.stdout
    assert run_cli(dsn, "serve", "--port", "99999").returncode == 2


def test_reads_go_through_the_readers_login(dsn: str, tmp_path: Path) -> None:
    reader = role_dsn(dsn, "status")
    with serve(dsn, **PROXY, JOBFENCE_READER_DATABASE_URL=reader) as s:
        made = s.post("/api/v1/jobs", spec(), headers=ALICE)
        assert made.status == 202  # a write: the operator's login
        got = s.get(f"/api/v1/jobs/{made.body['job_id']}", headers=BOB)
        assert got.status == 200 and s.get("/readyz").body == {"ready": True}
        with connect(dsn) as conn:
            logins = {r["application_name"]: r["usename"] for r in conn.execute(
                "SELECT application_name, usename FROM pg_stat_activity "
                "WHERE application_name LIKE 'jobfence-serve%%'").fetchall()}
    assert logins["jobfence-serve-reader"] == conninfo_to_dict(reader)["user"]
    assert logins["jobfence-serve"] == conninfo_to_dict(role_dsn(dsn, "serve"))["user"]
