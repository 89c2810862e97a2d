"""The HTTP API in this process, for tests that send it many requests: Starlette's test
client on the application ``jobfence serve`` runs, against a real database, and a reading
of everything a write could change (to show that a refused one changed nothing)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from starlette.testclient import TestClient

from devtools.sqlconn import connect
from jobfence.cluster import Cluster
from jobfence.console.api import Server
from jobfence.console.auth import Authenticator
from jobfence.db import Pool
from jobfence.settings import load_settings

LOCAL = "http://127.0.0.1:8080"


@contextmanager
def api_server(dsn: str, *, cluster_port: Cluster | None = None,
               **settings: Any) -> Iterator[Server]:
    """The API's server object (``.app()`` is the ASGI application), with a pool open."""
    settings = {"auth": "none", "cluster": "none", "log_level": "error", **settings}
    cfg = load_settings(database_url=dsn, **settings)
    pool = Pool(dsn, size=2)
    pool.open()
    try:
        yield Server(cfg, pool, Authenticator(cfg, bind_host="127.0.0.1", review=None),
                     cluster_port)
    finally:
        pool.close()


@contextmanager
def api_client(dsn: str, **settings: Any) -> Iterator[TestClient]:
    with api_server(dsn, **settings) as server, \
            TestClient(server.app(), base_url=LOCAL, raise_server_exceptions=False) as c:
        yield c


def asgi_request(app: Any, method: str, path: str, *, query: bytes = b"",
                 chunks: Iterable[bytes] = (), headers: dict[str, str] | None = None,
                 host: str = "127.0.0.1:8080") -> tuple[int, Any, int, dict[str, str]]:
    """One request to the ASGI application exactly as a server hands it over: the path
    percent-decoded, the query as sent, the body one ASGI message per chunk. The status,
    the answer (JSON when it says so), how many times the application asked for the body,
    and the answer's headers."""
    source = iter(chunks)
    asked = 0
    done = False

    async def receive() -> dict[str, Any]:
        nonlocal asked, done
        if done:
            return {"type": "http.disconnect"}
        asked += 1
        chunk = next(source, None)
        if chunk is None:
            done = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    head = {"host": host, **({"content-type": "application/json"} if method == "POST"
                             else {}), **(headers or {})}
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode("utf-8", "replace"), "root_path": "",
             "query_string": query, "server": ("127.0.0.1", 8080),
             "client": ("127.0.0.1", 40000),
             "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                         for k, v in head.items()]}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    answer_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start["headers"]}
    json_answer = answer_headers.get("content-type", "").startswith("application/json")
    return (start["status"], json.loads(raw) if raw and json_answer else raw, asked,
            answer_headers)


@contextmanager
def written(dsn: str) -> Iterator[Callable[[], tuple[Any, ...]]]:
    """A function reading everything the API can write: jobs, their events, drain mode,
    queue settings, trigger rows."""
    conn = connect(dsn)

    def read() -> tuple[Any, ...]:
        row = conn.execute(
            "SELECT (SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY job_id), ''))"
            "        FROM jobs t) AS jobs,"
            " (SELECT count(*) FROM job_events) AS events,"
            " (SELECT md5(string_agg(t::text, ',')) FROM jobfence_control t) AS control,"
            " (SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY name), ''))"
            "        FROM queues t) AS queues,"
            " (SELECT count(*) FROM function_triggers) AS triggers").fetchone()
        assert row is not None
        return tuple(row.values())

    try:
        yield read
    finally:
        conn.close()
