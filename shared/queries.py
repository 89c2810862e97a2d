"""Named SQL queries, parsed once from ``sql/queries.sql`` into a read-only mapping.

Callers ask for a query by name (``QUERIES["job_claim"]``); no SQL is assembled in Python.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- ([a-z][a-z0-9_]*) --$", re.MULTILINE)


class Queries(Mapping[str, LiteralString]):
    """Read-only name → SQL mapping; an unknown name raises ``KeyError`` naming it."""

    def __init__(self, text: str) -> None:
        self._queries: dict[str, LiteralString] = {}
        parts = _HEADER.split(text)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in self._queries:
                raise ValueError(f"query {name!r} is defined twice")
            lines = [ln for ln in body.strip().splitlines() if not ln.startswith("--")]
            statement = "\n".join(lines).strip().rstrip(";")
            if not statement:
                raise ValueError(f"query {name!r} is empty")
            # The text comes from our own package file, never from input.
            self._queries[name] = statement

    def __getitem__(self, name: str) -> LiteralString:
        try:
            return self._queries[name]
        except KeyError:
            raise KeyError(f"no query named {name!r} in queries.sql") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._queries)

    def __len__(self) -> int:
        return len(self._queries)


def _load() -> Queries:
    return Queries(resources.files("shared.sql").joinpath("queries.sql").read_text("utf-8"))


QUERIES = _load()
