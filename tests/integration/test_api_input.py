"""What the HTTP API reads, in this process against a real database: a body is bounded
while it streams, chunked or not (413 once it passes the limit, having held no more); every
query parameter goes through one strict parser (numbers in ASCII digits, each name known to
its route and given once, text that is UTF-8 without NUL); JSON is measured before it is
parsed (a body nested 100,000 deep is a 400, not a crash of the parser); a trigger this
server has no cluster for is a 503 saying why. Every refusal writes nothing.

tests/integration/test_api_fuzz.py sends the same application arbitrary requests;
tests/acceptance/test_serve_api.py measures a real server's memory under a large upload."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobfence.limits import MAX_SPEC_BYTES
from tests.support.api_client import api_client, api_server, asgi_request, written

CHUNK = 1024 * 1024


def padded(obj: object, size: int) -> bytes:
    """``obj`` as JSON, padded with spaces to exactly ``size`` bytes."""
    text = json.dumps(obj).encode()
    return text + b" " * (size - len(text))


def test_a_chunked_body_past_the_limit_is_413_having_read_no_more_than_the_limit(
        dsn: str) -> None:
    endless = (b" " * CHUNK for _ in range(3 * MAX_SPEC_BYTES // CHUNK))
    with api_server(dsn) as server, written(dsn) as state:
        before = state()
        status, body, asked, headers = asgi_request(server.app(), "POST", "/api/v1/jobs",
                                                    chunks=endless)
        assert status == 413, body
        assert "larger than" in body["error"]
        assert asked <= MAX_SPEC_BYTES // CHUNK + 1  # read up to the limit, not one chunk on
        assert headers["connection"] == "close"  # the client need not send the rest
        assert state() == before


def test_a_declared_length_past_the_limit_is_413_before_any_byte_is_read(dsn: str) -> None:
    with api_server(dsn) as server:
        status, body, asked, _ = asgi_request(
            server.app(), "POST", "/api/v1/drain", chunks=[b"{}"],
            headers={"content-length": str(MAX_SPEC_BYTES + 1)})
        assert (status, asked) == (413, 0), body


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_body_of_exactly_the_limit_is_read_and_one_byte_more_is_413(
        dsn: str, declared: bool) -> None:
    def post(size: int) -> tuple[int, Any]:
        data = padded({"on": False, "reason": "check"}, size)
        chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
        headers = {"content-length": str(len(data))} if declared else {}
        status, body, _, _ = asgi_request(server.app(), "POST", "/api/v1/drain", chunks=chunks,
                                        headers=headers)
        return status, body

    with api_server(dsn) as server:
        status, body = post(MAX_SPEC_BYTES)
        assert status == 200 and body["draining"] is False, body
        assert post(MAX_SPEC_BYTES + 1)[0] == 413


@pytest.mark.parametrize("query", [
    "/api/v1/jobs?limit=%C2%B2",            # "²": str.isdigit says yes, int() says no
    "/api/v1/jobs?limit=%D9%A1%D9%A2",      # "١٢": int() reads 12
    "/api/v1/jobs?limit=1_0",
    "/api/v1/jobs?limit=+5",                 # "+" is a space
    "/api/v1/jobs?limit=99999999999999999999999",
    "/api/v1/functions?runs=%C2%B2",
    "/api/v1/jobs?limit=5&limit=6",          # given twice: which one?
    "/api/v1/jobs?status=pending&status=failed",
    "/api/v1/jobs?resource=%FF%FE",          # not UTF-8: refused, not "replaced"
    "/api/v1/jobs?resource=a%00b",
    "/api/v1/jobs?%FF=1",
    "/api/v1/jobs?after=nope",
    "/api/v1/jobs?parent=%C2%B2",
    "/api/v1/jobs?queue=%C2%B2",
    pytest.param("/api/v1/jobs?label=" + ",".join(f"k{i}=v" for i in range(65)),
                 id="65-labels"),
    pytest.param("/api/v1/jobs?resource=" + "r" * 1001, id="resource-1001-chars"),
    "/api/v1/jobs?sort=x",
    "/api/v1/queues?x=1",                    # every route says which parameters it takes
    "/api/v1/drain?on=true",
    "/api/v1/me?user=admin",
    "/api/v1/jobs/01900000-0000-7000-8000-000000000000?events=0",
])
def test_a_malformed_query_is_400_saying_what_is_wrong(dsn: str, query: str) -> None:
    with api_client(dsn) as client:
        r = client.get(query)
        assert r.status_code == 400, (r.status_code, r.text[:300])
        assert r.json()["error"]


@pytest.mark.parametrize(("path", "status"), [
    ("/static/%00", 404), ("/static/a%00b.js", 404), ("/static/" + "x" * 5000, 404),
    ("/api/v1/jobs/", 404), ("/api/v1/nope", 404), ("/api/v1/jobs/%00", 400)])
def test_a_path_no_route_or_file_has_is_refused_in_json(
        dsn: str, path: str, status: int) -> None:
    with api_client(dsn) as client:
        r = client.get(path)
        assert r.status_code == status, (r.status_code, r.text[:300])
        assert r.json()["error"]


@pytest.mark.parametrize("query", [
    "/api/v1/jobs?&limit=50",  # what the console sends with no filter
    "/api/v1/jobs?status=&queue=&limit=007",
    "/api/v1/jobs?resource=a+b&label=team%3Dx",
    "/api/v1/functions?runs=0",
])
def test_a_well_formed_query_is_answered(dsn: str, query: str) -> None:
    with api_client(dsn) as client:
        r = client.get(query)
        assert r.status_code == 200, r.text[:300]


def test_the_next_page_link_repeats_the_filters_as_given(dsn: str) -> None:
    with api_client(dsn) as client:
        job = {"actions": [{"name": "sleep", "params": {"seconds": 0}}],
               "labels": {"team": "a b"}}
        for _ in range(3):
            assert client.post("/api/v1/jobs", json=job).status_code == 202
        first = client.get("/api/v1/jobs?label=team%3Da+b&limit=2&status=").json()
        assert len(first["jobs"]) == 2
        second = client.get(first["next"]).json()
        assert len(second["jobs"]) == 1 and second["next"] is None


DEEP = 100_000


@pytest.mark.parametrize("path", [
    "/api/v1/jobs", "/api/v1/jobs/01900000-0000-7000-8000-000000000000/cancel",
    "/api/v1/jobs/01900000-0000-7000-8000-000000000000/retry", "/api/v1/queues/q/pause",
    "/api/v1/queues/q/limit", "/api/v1/drain", "/api/v1/functions/sweeper/trigger"])
@pytest.mark.parametrize("body", [
    b"[" * DEEP + b"]" * DEEP,
    b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    b'{"reason": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    b"[" * DEEP,
], ids=["arrays", "objects", "inside", "unclosed"])
def test_json_nested_100000_deep_is_400_and_writes_nothing(
        dsn: str, path: str, body: bytes) -> None:
    with api_client(dsn) as client, written(dsn) as state:
        before = state()
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (r.status_code, r.text[:300])
        assert "nested" in r.json()["error"]
        assert state() == before


@pytest.mark.parametrize("body", [
    b'{"on": NaN}', b'{"on": true, "reason": Infinity}', b'{"on": true, "x": -Infinity}',
    b'{"on": true, "reason": "a\\u0000b"}', b'{"on": true, "reason": "\\ud800"}',
    b'{"on": true, "n": ' + b"9" * 5000 + b"}", b'\xef\xbb\xbf{"on": true}',
    b'{"on": true}' + b"\xff", b'{"on": true, "x": ' + b"[" * 34 + b"]" * 34 + b"}"])

def test_a_body_that_is_not_storable_json_is_400_and_writes_nothing(
        dsn: str, body: bytes) -> None:
    with api_client(dsn) as client, written(dsn) as state:
        before = state()
        r = client.post("/api/v1/drain", content=body,
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (r.status_code, r.text[:300])
        assert state() == before


def test_a_trigger_without_a_cluster_is_503_saying_why_and_records_nothing(
        dsn: str) -> None:
    with api_client(dsn) as client, written(dsn) as state:
        before = state()
        r = client.post("/api/v1/functions/sweeper/trigger", json={"reason": "INC-1"})
        assert r.status_code == 503, (r.status_code, r.text[:300])
        assert "JOBFENCE_CLUSTER" in r.json()["error"]
        assert state() == before
        listed = client.get("/api/v1/functions").json()
        assert listed["triggers"] == []
