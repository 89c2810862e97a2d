"""The HTTP API fuzzed (hypothesis, a fixed seed) against a real database: whatever the
method, path, query, headers, content type and body — chunked or not, any bytes, JSON nested
to any depth — the answer is one of the API's status codes with a JSON body saying why
when it refuses, never a 500, and a refused write changes nothing.

The application runs in this process (Starlette's test client, or the ASGI application
called as a server calls it), so a few hundred requests take seconds;
tests/acceptance/test_serve_api.py calls the same code over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from jobfence.console.api import Server
from tests.support.api_client import api_client, api_server, asgi_request, written

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
    "run_at": JSONISH, "delay": JSONISH, "labels": JSONISH, "after": JSONISH,
    "expires_in": JSONISH})
QUERY = st.dictionaries(st.sampled_from(["status", "queue", "resource", "label", "parent",
                                         "after", "limit", "runs", "x"]), TEXT | IDISH,
                        max_size=4)
ANSWERS = {200, 202, 400, 403, 404, 405, 409, 413, 429, 502, 503}

ROUTES = ["/api/v1/jobs", "/api/v1/jobs/{}", "/api/v1/jobs/{}/cancel", "/api/v1/jobs/{}/retry",
          "/api/v1/queues", "/api/v1/queues/{}/pause", "/api/v1/queues/{}/resume",
          "/api/v1/queues/{}/limit", "/api/v1/drain", "/api/v1/functions",
          "/api/v1/functions/{}/trigger", "/api/v1/me", "/api/v1/openapi.json", "/healthz",
          "/static/{}", "/api/v1/{}", "/{}"]
PATHS = st.builds(lambda route, part: route.format(part), st.sampled_from(ROUTES),
                  IDISH | st.sampled_from(["default", "sweeper", "console.js", "../x"])) \
    | TEXT.map(lambda t: "/" + t)
QUERY_BYTES = st.lists(
    st.sampled_from([b"&", b"=", b"+", b"%", b"%C2%B2", b"%FF", b"%00", b"limit", b"runs",
                     b"status", b"after", b"label", b"5", b"-1", b"pending", b"%3D", b"%2C"])
    | st.binary(max_size=4) | st.binary(min_size=1, max_size=1).map(
        lambda b: b"%" + b.hex().encode()),
    max_size=12).map(b"".join)


def nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


BODIES = (st.binary(max_size=200)
          | st.builds(lambda v: json.dumps(v, allow_nan=True).encode(),
                      JSONISH | SPECISH | st.lists(SPECISH, max_size=2))
          | st.builds(nested, st.integers(0, 5000))
          | st.builds(lambda d, k: b'{"on": true, "reason": "x", "' + k.encode() + b'": '
                      + nested(d) + b"}", st.integers(0, 200), TEXT.filter(
                          lambda t: '"' not in t and "\\" not in t))
          | st.sampled_from([b"", b"   ", b'{"on": NaN}', b'{"reason": "\\u0000"}',
                             b'{"on": true, "reason": "\\udfff"}', b"\xef\xbb\xbf{}",
                             b'{"limit": 1e999}', b'{"limit": ' + b"9" * 5000 + b"}",
                             b'{"actions": [{"name": "sleep", "params": {"seconds": 0}}],'
                             b' "expires_in": "PT1S", "delay": "PT1H"}']))
CONTENT_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-8",
                                 "APPLICATION/JSON", "text/plain", "",
                                 "application/x-www-form-urlencoded"]) \
    | st.text(st.characters(codec="latin-1"), max_size=30)


@pytest.fixture
def client(dsn: str) -> Iterator[TestClient]:
    with api_client(dsn) as c:
        yield c


@pytest.fixture
def server(dsn: str) -> Iterator[Server]:
    with api_server(dsn) as s:
        yield s


@pytest.fixture
def counts(dsn: str) -> Iterator[Callable[[], tuple[Any, ...]]]:
    with written(dsn) as read:
        yield read


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
    before = counts()
    raw = json.dumps(body, allow_nan=True).encode()
    resp = client.post(path.format(quote(target, safe="")), content=raw,
                       headers={"Content-Type": content_type} if content_type else {})
    check(resp, before, counts())
    if content_type.split(";", maxsplit=1)[0] != "application/json":
        assert resp.status_code in (403, 404)  # 404: no route has that path


@FUZZ
@given(raw=st.binary(max_size=200))
def test_bodies_that_are_not_json(client: TestClient, counts: Any, raw: bytes) -> None:
    before = counts()
    resp = client.post("/api/v1/jobs", content=raw,
                       headers={"Content-Type": "application/json"})
    check(resp, before, counts())


@settings(FUZZ, max_examples=400)
@given(method=st.sampled_from(["GET", "POST", "POST", "POST", "HEAD", "PUT", "DELETE",
                               "PATCH", "OPTIONS"]),
       path=PATHS, query=QUERY_BYTES, body=BODIES, content_type=CONTENT_TYPES,
       chunk=st.integers(1, 64),
       declared=st.none() | st.sampled_from(["0", "-1", "²", "1e9", " 12", "99999999999999"
                                             "99999999999", "67108865"]),
       extra=st.dictionaries(st.sampled_from(["origin", "sec-fetch-site",
                                              "x-forwarded-proto", "host"]),
                             st.text(st.characters(codec="latin-1"), max_size=20),
                             max_size=2))
def test_any_request_is_answered_without_a_500_and_a_refusal_changes_nothing(
        server: Server, counts: Any, method: str, path: str, query: bytes, body: bytes,
        content_type: str, chunk: int, declared: str | None, extra: dict[str, str]) -> None:
    """Any request at all, handed to the application as a server hands it over."""
    headers = {**extra, "content-type": content_type}
    if declared is not None:
        headers["content-length"] = declared
    before = counts()
    status, answer, _, got = asgi_request(
        server.app(), method, path, query=query, headers=headers,
        chunks=[body[i:i + chunk] for i in range(0, len(body), chunk)])
    assert status in ANSWERS | {401}, (status, answer)
    if status >= 400:
        assert counts() == before, (method, path, query, status, answer)
        if method != "HEAD" and got.get("content-type", "").startswith("application/json"):
            assert isinstance(answer, dict) and answer.get("error"), answer
        elif method != "HEAD":
            raise AssertionError(f"{status} without a JSON error: {answer!r:.300}")
