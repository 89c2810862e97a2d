"""``pg-maintenance``: a jobfence action that runs ``ANALYZE`` or ``VACUUM (ANALYZE)`` on one
table of a PostgreSQL database — and, at enqueue, checks the job's ``resource`` against it.
A job for a table that is not there is refused before anything is written (exit 2 from
``jobfence enqueue``, 400 from the HTTP API, ``jobfence.InvalidSpec`` from the Python
API): a maintenance job for a table that does not exist is a mistake to report at once::

    export PG_MAINTENANCE_DATABASE_URL=postgresql://maintainer@shop-db/shop
    jobfence enqueue 'pg-maintenance:{"table": "shop.orders", "operation": "vacuum"}' \\
        --resource shop.orders

The job's resource must be the table it maintains: jobfence runs at most one active job per
resource, so no two maintenance jobs ever work on one table at once. The database is
``PG_MAINTENANCE_DATABASE_URL`` — where jobs are enqueued, for the check, and in the worker
pods of the pool that runs them. When it cannot be reached the enqueue is refused as
unavailable (exit 4, HTTP 503): try again.

Install it (``pip install ./examples/pg_maintenance``) into every image that enqueues or
runs its jobs; ``pyproject.toml`` declares the entry point. The three methods are the
action plugin API (docs/REFERENCE.md, "Action plugins").
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

import jobfence

NAME = re.compile(r"^([a-z_][a-z0-9_]{0,62})\.([a-z_][a-z0-9_]{0,62})$")
"""``schema.table``, each a lower-case PostgreSQL identifier (what it names unquoted)."""

OPERATIONS = ("analyze", "vacuum")
DATABASE_URL = "PG_MAINTENANCE_DATABASE_URL"
TABLE_KINDS = ("r", "p", "m")
"""What ANALYZE and VACUUM work on: tables, partitioned tables, materialized views."""


def _url() -> str:
    url = os.environ.get(DATABASE_URL)
    if not url:
        raise jobfence.InvalidSpec(f"{DATABASE_URL} is not set: which database to maintain?")
    return url


class PgMaintenance:
    name = "pg-maintenance"

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The params alone, normalized (called at enqueue, before the resource check)."""
        unknown = sorted(set(params) - {"table", "operation"})
        if unknown:
            raise jobfence.InvalidSpec(f"action 'pg-maintenance': unknown params {unknown}")
        table, operation = params.get("table"), params.get("operation", "analyze")
        if not isinstance(table, str) or not NAME.fullmatch(table):
            raise jobfence.InvalidSpec("action 'pg-maintenance': table: SCHEMA.TABLE in "
                                       "lower case is required (e.g. shop.orders)")
        if operation not in OPERATIONS:
            raise jobfence.InvalidSpec(f"action 'pg-maintenance': operation: one of "
                                       f"{', '.join(OPERATIONS)}")
        return {"table": table, "operation": operation}

    def validate_resource(self, resource: str | None, params: Mapping[str, Any]) -> None:
        """The job's resource is the table it maintains, and that table exists."""
        table = params["table"]
        if resource != table:
            raise jobfence.InvalidSpec(
                f"the job's resource must be the table it maintains, {table}: then no two "
                "jobs maintain it at once")
        schema, name = table.split(".")
        try:
            with psycopg.connect(_url(), connect_timeout=5, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT c.relkind FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s", (schema, name)).fetchone()
        except psycopg.OperationalError as exc:
            raise jobfence.Unavailable(f"cannot look {table} up: {exc}") from None
        if row is None or row[0] not in TABLE_KINDS:
            raise jobfence.InvalidSpec(f"table {table} does not exist in the maintained "
                                       "database")

    def run(self, ctx: Any, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Run the operation; a cancel, a lost fence or SIGTERM cancels the statement."""
        schema, name = params["table"].split(".")
        verb = "VACUUM (ANALYZE) {}" if params["operation"] == "vacuum" else "ANALYZE {}"
        with psycopg.connect(_url(), connect_timeout=10, autocommit=True) as conn:
            done = threading.Event()

            def cancel_on_stop() -> None:
                while not done.wait(0.2):
                    if ctx.stop.is_set():
                        conn.cancel_safe()
                        return

            watcher = threading.Thread(target=cancel_on_stop, daemon=True)
            watcher.start()
            try:
                conn.execute(sql.SQL(verb).format(sql.Identifier(schema, name)))
            finally:
                done.set()
                watcher.join()
        ctx.check_stop()  # a statement cancelled on stop did not finish
        return {"operation": params["operation"], "table": params["table"]}
