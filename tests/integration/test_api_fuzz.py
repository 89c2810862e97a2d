"""The HTTP API fuzzed (hypothesis, a fixed seed) against a real database: whatever the
path, query, headers and body, the answer is one of the API's status codes with a JSON body
— never a 500 — and a refused write changes nothing.

The application runs in this process (Starlette's test client), so a few hundred requests
take seconds; tests/acceptance/test_serve_api.py calls the same code over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from devtools.sqlconn import connect
from jobfence.console.api import Server
from jobfence.console.auth import Authenticator
from jobfence.db import Pool
from jobfence.settings import load_settings

FUZZ = settings(max_examples=200, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
JOB = "01900000-0000-7000-8000-000000000000"
IDISH = st.sampled_from([JOB, "nope", "", "0" * 36, JOB.upper(), "%00", "..", "a/b"]) | TEXT
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=10)
SPECISH = st.fixed_dictionaries({"actions": st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["sleep", "command", "noop", ""]) | TEXT,
     "params": JSONISH}), max_size=2)}, optional={
    "resource": JSONISH, "queue": JSONISH, "ttl": JSONISH, "max_attempts": JSONISH,
    "run_at": JSONISH, "delay": JSONISH, "labels": JSONISH, "after": JSONISH})
QUERY = st.dictionaries(st.sampled_from(["status", "queue", "resource", "label", "parent",
                                         "after", "limit", "runs", "x"]), TEXT | IDISH,
                        max_size=4)
ANSWERS = {200, 202, 400, 403, 404, 409, 429, 502, 503}


@pytest.fixture
def client(dsn: str) -> Iterator[TestClient]:
    cfg = load_settings(database_url=dsn, auth="none", cluster="none",
                        log_level="error")
    pool = Pool(dsn, size=2)
    pool.open()
    app = Server(cfg, pool, Authenticator(cfg, bind_host="127.0.0.1", review=None),
                 None).app()
    with TestClient(app, base_url="http://127.0.0.1:8080",
                    raise_server_exceptions=False) as c:
        yield c
    pool.close()


@pytest.fixture
def counts(dsn: str) -> Iterator[Any]:
    conn = connect(dsn)

    def read() -> tuple[Any, ...]:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM jobs) AS a, (SELECT count(*) FROM job_events) AS b,"
            " (SELECT draining::int FROM jobfence_control) AS c,"
            " (SELECT count(*) FROM queues) AS d,"
            " (SELECT count(*) FROM function_triggers) AS e").fetchone()
        assert row is not None
        return tuple(row.values())

    yield read
    conn.close()


def check(resp: Any, before: tuple[Any, ...], after: tuple[Any, ...]) -> None:
    assert resp.status_code in ANSWERS, (resp.status_code, resp.text[:300])
    body = resp.json()
    if resp.status_code >= 400:
        assert isinstance(body.get("error"), str) and body["error"], body
        assert after == before, (resp.request.url, resp.status_code, body)


@FUZZ
@given(path=st.sampled_from(["/api/v1/jobs", "/api/v1/jobs/{}", "/api/v1/queues",
                             "/api/v1/drain", "/api/v1/functions", "/api/v1/me"]),
       job=IDISH, query=QUERY)
def test_reads(client: TestClient, counts: Any, path: str, job: str,
               query: dict[str, str]) -> None:
    before = counts()
    resp = client.get(path.format(quote(job, safe="")), params=query)
    if resp.status_code == 404 and not resp.headers.get("content-type", "").startswith(
            "application/json"):
        return  # a path no route has (Starlette's own 404)
    check(resp, before, counts())


@FUZZ
@given(path=st.sampled_from(["/api/v1/jobs", "/api/v1/jobs/{}/cancel", "/api/v1/jobs/{}/retry",
                             "/api/v1/queues/{}/pause", "/api/v1/queues/{}/resume",
                             "/api/v1/queues/{}/limit", "/api/v1/drain",
                             "/api/v1/functions/{}/trigger"]),
       target=IDISH | st.sampled_from(["default", "sweeper", "q"]),
       body=JSONISH | SPECISH | st.lists(SPECISH, max_size=2),
       content_type=st.sampled_from(["application/json", "application/json; charset=utf-8",
                                     "text/plain", "", "application/x-www-form-urlencoded"]))
def test_writes(client: TestClient, counts: Any, path: str, target: str, body: Any,
                content_type: str) -> None:
    import json

    before = counts()
    raw = json.dumps(body, allow_nan=True).encode()
    resp = client.post(path.format(quote(target, safe="")), content=raw,
                       headers={"Content-Type": content_type} if content_type else {})
    if resp.status_code == 404 and not resp.headers.get("content-type", "").startswith(
            "application/json"):
        return
    check(resp, before, counts())
    if content_type.split(";", maxsplit=1)[0] != "application/json":
        assert resp.status_code == 403


@FUZZ
@given(raw=st.binary(max_size=200))
def test_bodies_that_are_not_json(client: TestClient, counts: Any, raw: bytes) -> None:
    before = counts()
    resp = client.post("/api/v1/jobs", content=raw,
                       headers={"Content-Type": "application/json"})
    check(resp, before, counts())
