"""What every noun of the store shares: its connection, its named statements (the
``.sql`` file of the same name beside it, rendered for the installation's schema), and the
one way to run them (``jobfence.db.execute``: every psycopg error translated there)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from jobfence import db
from jobfence.db import Connection, Cursor, Queries

T = TypeVar("T")


class Noun:
    """A group of store verbs acting on one thing (jobs, attempts...). A statement named
    ``x`` in ``<noun>.sql`` is run by the method ``x`` (composite verbs may run several)."""

    sql_file: ClassVar[str]

    def __init__(self, conn: Connection, schema: str) -> None:
        self.conn = conn
        self.schema = schema
        self.sql: Queries = db.queries("jobfence.store", self.sql_file, schema)

    def _execute(self, name: str, params: Mapping[str, Any] | None = None) -> Cursor:
        return db.execute(self.conn, self.sql[name], params)

    def _one(self, name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        row: dict[str, Any] | None = self._execute(name, params).fetchone()
        return row

    def _all(self, name: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._execute(name, params).fetchall()
        return rows

    def _rows(self, name: str, params: Mapping[str, Any] | None, row: type[T]) -> list[T]:
        """Every row as the dataclass ``row``."""
        rows: list[T] = db.execute(self.conn, self.sql[name], params, row=row).fetchall()
        return rows

    def _row(self, name: str, params: Mapping[str, Any] | None, row: type[T]) -> T | None:
        found: T | None = db.execute(self.conn, self.sql[name], params, row=row).fetchone()
        return found

    def _count(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        """How many rows the statement changed."""
        return self._execute(name, params).rowcount
