"""Schema administration, for ``jobfence migrate`` only: whether a relation exists, and
moving an older release's objects into the schema of their own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import LiteralString

from psycopg import sql

from jobfence.db import Connection, execute


def relation_exists(conn: Connection, schema: str, name: str) -> bool:
    row = execute(conn, "SELECT to_regclass(%(name)s) IS NOT NULL AS found",
                  {"name": sql.Identifier(schema, name).as_string(None)}).fetchone()
    return bool(row and row["found"])


def move_objects(conn: Connection, *, source: str, target: str, tables: Sequence[str],
                 functions: Sequence[tuple[str, LiteralString]]) -> None:
    """Move named tables (their indexes, constraints, triggers and owned sequences go with
    them) and functions (name, argument types — this package's own constants) from one
    schema to another, in the caller's transaction; those the source lacks are skipped (a
    release older than the one that made them)."""
    for table in tables:
        if relation_exists(conn, source, table):
            execute(conn, sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(
                sql.Identifier(source, table), sql.Identifier(target)))
    for name, args in functions:
        found = execute(conn, sql.SQL("SELECT to_regprocedure({}) IS NOT NULL AS found").format(
            sql.Literal(sql.SQL("{}({})").format(sql.Identifier(source, name), sql.SQL(args))
                        .as_string(None)))).fetchone()
        if not (found and found["found"]):
            continue
        execute(conn, sql.SQL("ALTER FUNCTION {}({}) SET SCHEMA {}").format(
            sql.Identifier(source, name), sql.SQL(args), sql.Identifier(target)))
