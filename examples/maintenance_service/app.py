"""A table-maintenance service on jobfence's Python API: the submission API of a service
that compacts tables and expires their snapshots, each request enqueued in the same
transaction as the service's own audit row.

    POST /tables/{db}/{table}/maintenance   {"operation": "compact" | "expire_snapshots"}
         202 + Location: /jobs/{job_id}     the job is queued (its audit row with it)
         400                                a bad body or name (nothing written)
         409                                the table has maintenance queued or running
         503 + Retry-After                  jobfence is draining
    GET  /jobs/{job_id}                     the job, as `jobfence status -o json` shows it
    GET  /healthz

An ``Idempotency-Key`` header makes a retried POST answer with the job it already made.
Run it with ``DATABASE_URL`` (a login with the jobfence operator role and this service's
table) and ``python examples/maintenance_service/app.py --create-table --port 8080``; its
connection pool is ``psycopg-pool``, which jobfence itself depends on (for ``jobfence serve``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

import psycopg
from psycopg_pool import ConnectionPool

import jobfence

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
OPERATIONS = {"compact", "expire_snapshots"}
MAX_BODY = 64 * 1024

AUDIT_TABLE = """
CREATE TABLE IF NOT EXISTS maintenance_requests (
    id           bigserial PRIMARY KEY,
    requested_at timestamptz NOT NULL DEFAULT now(),
    db           text NOT NULL,
    table_name   text NOT NULL,
    operation    text NOT NULL,
    requested_by text,
    job_id       uuid NOT NULL
)"""


class Response:
    def __init__(self, status: str, body: dict[str, Any],
                 headers: list[tuple[str, str]] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or []


def error(status: str, message: str, *headers: tuple[str, str]) -> Response:
    return Response(status, {"error": message}, list(headers))


class Service:
    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self.pool = pool

    def __call__(self, environ: WSGIEnvironment,
                 start_response: StartResponse) -> Iterable[bytes]:
        try:
            response = self.route(environ)
        except jobfence.StoreUnavailable:
            response = error("503 Service Unavailable", "the database is unavailable",
                             ("Retry-After", "5"))
        body = json.dumps(response.body).encode()
        start_response(response.status, [("Content-Type", "application/json"),
                                         ("Content-Length", str(len(body))),
                                         *response.headers])
        return [body]

    def route(self, environ: WSGIEnvironment) -> Response:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        parts = [p for p in path.split("/") if p]
        if parts == ["healthz"] and method == "GET":
            return Response("200 OK", {"ok": True})
        if len(parts) == 4 and parts[0] == "tables" and parts[3] == "maintenance":
            if method != "POST":
                return error("405 Method Not Allowed", "POST a maintenance request",
                             ("Allow", "POST"))
            return self.submit(environ, parts[1], parts[2])
        if len(parts) == 2 and parts[0] == "jobs":
            if method != "GET":
                return error("405 Method Not Allowed", "GET a job", ("Allow", "GET"))
            return self.job(parts[1])
        return error("404 Not Found", f"no route for {method} {path[:200]}")

    def submit(self, environ: WSGIEnvironment, db: str, table: str) -> Response:
        if not (NAME.match(db) and NAME.match(table)):
            return error("400 Bad Request", "db and table must be plain identifiers")
        body = read_json(environ)
        if not isinstance(body, dict) or body.get("operation") not in OPERATIONS \
                or set(body) - {"operation", "requested_by"}:
            return error("400 Bad Request", 'expected {"operation": "compact" | '
                         '"expire_snapshots", "requested_by"?: string}')
        operation, who = body["operation"], body.get("requested_by")
        if who is not None and not isinstance(who, str):
            return error("400 Bad Request", "requested_by must be a string")
        spec: dict[str, Any] = {
            "actions": [{"name": "command",
                         "params": {"argv": ["echo", operation, f"{db}.{table}"]}}],
            "resource": f"{db}.{table}",
            "labels": {"operation": operation, "db": db, "table": table},
        }
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        if key:
            spec["idempotency_key"] = f"maintenance:{key}"
        try:
            with self.pool.connection() as conn, conn.transaction():
                [job] = jobfence.enqueue(conn, spec)
                if job.get("created", True):
                    conn.execute(
                        "INSERT INTO maintenance_requests "
                        "(db, table_name, operation, requested_by, job_id) "
                        "VALUES (%s, %s, %s, %s, %s)",
                        (db, table, operation, who, job["job_id"]))
        except jobfence.ResourceBusy:
            return error("409 Conflict", f"{db}.{table} has maintenance queued or running")
        except jobfence.Drained:
            return error("503 Service Unavailable", "maintenance is paused (drain mode)",
                         ("Retry-After", "60"))
        except (jobfence.InvalidSpec, jobfence.IdempotencyConflict) as exc:
            return error("400 Bad Request", str(exc))
        location = f"/jobs/{job['job_id']}"
        return Response("202 Accepted", {**job, "location": location},
                        [("Location", location)])

    def job(self, job_id: str) -> Response:
        try:
            with self.pool.connection() as conn:
                return Response("200 OK", jobfence.status(conn, job_id))
        except jobfence.JobNotFound:
            return error("404 Not Found", f"no job {job_id[:80]}")
        except jobfence.InvalidSpec as exc:
            return error("400 Bad Request", str(exc))


def read_json(environ: WSGIEnvironment) -> object:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    if not 0 < length <= MAX_BODY:
        return None
    try:
        parsed: object = json.loads(environ["wsgi.input"].read(length))
    except (ValueError, UnicodeDecodeError):
        return None
    return parsed


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0: any free port")
    p.add_argument("--create-table", action="store_true",
                   help="create the service's audit table if it does not exist")
    args = p.parse_args(argv)
    url = os.environ.get("DATABASE_URL")
    if not url:
        p.error("DATABASE_URL is required")
    if args.create_table:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(AUDIT_TABLE)
    with ConnectionPool(url, min_size=1, max_size=8, open=True) as pool:
        server = make_server(args.host, args.port, Service(pool),
                             server_class=ThreadingServer)
        print(f"listening on http://{args.host}:{server.server_port}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
