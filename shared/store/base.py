"""What every noun of the store shares: its connection, its named statements (the
``.sql`` file of the same name beside it, rendered for the installation's schema), and the
one way to run them (``jobfence.db.execute``: every psycopg error translated there)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from jobfence import db
from jobfence.db import Connection, Cursor, Queries
from jobfence.store.types import Moved, Transition

if TYPE_CHECKING:
    from jobfence.store import Store

T = TypeVar("T")


class Noun:
    """A group of store verbs acting on one thing (jobs, attempts...). A statement named
    ``x`` in ``<noun>.sql`` is run by the method ``x`` (composite verbs may run several)."""

    sql_file: ClassVar[str]

    def __init__(self, store: Store) -> None:
        self.store = store
        self.conn: Connection = store.conn
        self.sql: Queries = db.queries("jobfence.store", self.sql_file, store.schema)

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

    def _settle(self, done: list[Transition]) -> Moved:
        """The one settle rule of every verb that moves jobs, run by the verb once its
        transaction has committed, never by its caller: what waited on the jobs it made
        terminal is released or failed (``Dependencies.settle``: at most ``SETTLE_BATCH``
        inline, export-finalize pages through the rest)."""
        return Moved(done, self.store.dependencies.settle(done))

    def _count(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        """How many rows the statement changed."""
        return self._execute(name, params).rowcount
