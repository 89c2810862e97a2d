"""The example application (examples/maintenance_service) as a user meets it: a real HTTP
server on 127.0.0.1 started by the test, requests over HTTP, and the job it enqueued —
with its own audit row, in one transaction — run by a real worker to `succeeded`."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support import REPO, Dsn, cli_env, role_dsn, run_cli
from tests.support.procs import kill_quietly

APP = REPO / "examples" / "maintenance_service" / "app.py"


class Client:
    def __init__(self, base: str) -> None:
        self.base = base

    def request(self, method: str, path: str, body: object = None, *,
                raw: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, dict(resp.headers), json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), json.loads(exc.read())


@pytest.fixture
def service(dsn: Dsn, conn: Any) -> Iterator[Client]:
    login = str(psycopg.conninfo.conninfo_to_dict(role_dsn(dsn, "enqueue"))["user"])
    conn.execute("CREATE SCHEMA app")
    conn.execute(f'GRANT USAGE, CREATE ON SCHEMA app TO "{login}"')
    url = psycopg.conninfo.make_conninfo(role_dsn(dsn, "enqueue"), options="-c search_path=app")
    env = {**cli_env(dsn), "DATABASE_URL": url}
    proc = subprocess.Popen([sys.executable, str(APP), "--port", "0", "--create-table"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), proc.stderr.read()
        yield Client(line.split()[-1])
    finally:
        kill_quietly(proc)


def test_the_example_service_submits_refuses_and_reports_over_http(
        dsn: Dsn, conn: Any, service: Client) -> None:
    code, headers, body = service.request("POST", "/tables/sales/orders/maintenance",
                                          {"operation": "compact", "requested_by": "ana"})
    assert code == 202, body
    location = headers["Location"]
    assert location == f"/jobs/{body['job_id']}" and body["status"] == "pending"
    # The service's own audit row committed with the job.
    [audit] = conn.execute("SELECT * FROM app.maintenance_requests").fetchall()
    assert (audit["db"], audit["table_name"], audit["operation"], audit["requested_by"],
            str(audit["job_id"])) == ("sales", "orders", "compact", "ana", body["job_id"])

    code, _, busy = service.request("POST", "/tables/sales/orders/maintenance",
                                    {"operation": "expire_snapshots"})
    assert code == 409 and "sales.orders" in busy["error"]
    for path, payload, raw in (
            ("/tables/sales/orders/maintenance", {"operation": "vacuum"}, None),
            ("/tables/sales/orders/maintenance", None, b"{not json"),
            ("/tables/sales/orders/maintenance", {"operation": "compact", "x": 1}, None),
            ("/tables/sales/or-ders/maintenance", {"operation": "compact"}, None)):
        code, _, bad = service.request("POST", path, payload, raw=raw)
        assert code == 400 and bad["error"], (path, payload, raw)
    assert run_cli(dsn, "drain", "on", "--reason", "upgrade").returncode == 0
    code, headers, drained = service.request("POST", "/tables/sales/clicks/maintenance",
                                             {"operation": "compact"})
    assert code == 503 and headers["Retry-After"] == "60", drained
    assert run_cli(dsn, "drain", "off").returncode == 0
    # Refusals wrote nothing: one job, one audit row.
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"] == 1
    assert conn.execute("SELECT count(*) AS n FROM app.maintenance_requests"
                        ).fetchone()["n"] == 1

    # A retried POST with the same Idempotency-Key answers with the job it made.
    first = service.request("POST", "/tables/sales/users/maintenance",
                            {"operation": "compact"}, headers={"Idempotency-Key": "r-1"})
    again = service.request("POST", "/tables/sales/users/maintenance",
                            {"operation": "compact"}, headers={"Idempotency-Key": "r-1"})
    assert first[0] == again[0] == 202 and first[2]["job_id"] == again[2]["job_id"]
    assert again[2]["created"] is False

    code, _, job = service.request("GET", location)
    assert code == 200 and job["status"] == "pending" and job["resource"] == "sales.orders"
    r = run_cli(dsn, "worker", "--max-jobs", "5")
    assert r.returncode == 0, r.stderr
    code, _, job = service.request("GET", location)
    assert code == 200 and job["status"] == "succeeded", job
    assert [a["status"] for a in job["actions"]] == ["succeeded"]
    assert service.request("GET", "/jobs/01a20000-0000-7000-8000-000000000000")[0] == 404
    assert service.request("GET", "/jobs/not-a-job")[0] == 400
    assert service.request("GET", "/nowhere")[0] == 404
