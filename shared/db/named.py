"""Named SQL: the statements of one ``.sql`` file by name, rendered once for the
installation's schema, and the few statements built from identifiers (``statement``) or
literals (``literal_fill``, ``literal``) — always through psycopg's ``sql`` composition, never
by string formatting. Part of the database module (``jobfence.db``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import LiteralString

from psycopg import sql

from jobfence.errors import ConfigError
from jobfence.limits import schema_refusal

_HEADER = re.compile(r"^-- ([a-z][a-z0-9_]*) --$", re.MULTILINE)


class Queries(Mapping[str, LiteralString]):
    """Read-only name → statement mapping of one ``.sql`` file, rendered for a schema; an
    unknown name raises ``KeyError`` naming the file."""

    def __init__(self, text: str, *, schema: str = "jobfence", source: str = "sql",
                 names: Mapping[str, str] | None = None) -> None:
        if (why := schema_refusal(schema)) is not None:
            raise ConfigError(f"schema {why}")
        self.source = source
        self._queries: dict[str, LiteralString] = {}
        parts = _HEADER.split(text)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in self._queries:
                raise ValueError(f"{source}: query {name!r} is defined twice")
            lines = [ln for ln in body.strip().splitlines() if not ln.startswith("--")]
            statement = "\n".join(lines).strip().rstrip(";")
            if not statement:
                raise ValueError(f"{source}: query {name!r} is empty")
            # The text comes from our own package file, the schema is a checked identifier.
            identifiers = {k: sql.Identifier(v) for k, v in (names or {}).items()}
            rendered = sql.SQL(statement).format(
                schema=sql.Identifier(schema), **identifiers).as_string(None)
            self._queries[name] = rendered

    def __getitem__(self, name: str) -> LiteralString:
        try:
            return self._queries[name]
        except KeyError:
            raise KeyError(f"no query named {name!r} in {self.source}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._queries)

    def __len__(self) -> int:
        return len(self._queries)


@cache
def queries(package: str, filename: str, schema: str, **names: str) -> Queries:
    """The named statements of ``package/filename`` for ``schema`` (and any other
    identifiers the file names, e.g. ``worker="jobfence_worker"``), parsed once."""
    text = resources.files(package).joinpath(filename).read_text("utf-8")
    return Queries(text, schema=schema, source=filename, names=names)


def literal_fill(template: LiteralString, **values: str) -> LiteralString:
    """A statement with ``{name}`` fields filled in as SQL literals: for a statement that
    runs without parameters (a KEDA trigger query)."""
    filled = sql.SQL(template).format(**{k: sql.Literal(v) for k, v in values.items()})
    return filled.as_string(None)


def statement(template: LiteralString, *, trusted: Mapping[str, str] | None = None,
              **identifiers: str | tuple[str, ...]) -> sql.Composed:
    """``template`` with ``{name}`` placeholders filled in as quoted identifiers (a tuple:
    a qualified name), and ``trusted`` ones as SQL text the server itself rendered (e.g. a
    function's argument list from ``pg_get_function_identity_arguments``)."""
    parts: dict[str, sql.Composable] = {
        k: sql.Identifier(*v) if isinstance(v, tuple) else sql.Identifier(v)
        for k, v in identifiers.items()}
    parts.update({k: sql.SQL(v) for k, v in (trusted or {}).items()})
    return sql.SQL(template).format(**parts)


def literal(value: str) -> str:
    """``value`` as quoted SQL text, for a statement that takes no parameters (``COMMENT
    ON``)."""
    return str(sql.Literal(value).as_string(None))
