"""queries.sql: every query the code names exists, and every query defined is used."""

from __future__ import annotations

import re

import pytest

from shared.queries import QUERIES, Queries
from tests.conftest import REPO

USE = re.compile(r'QUERIES\["([a-z0-9_]+)"\]')


def used_names() -> set[str]:
    names: set[str] = set()
    for folder in ("shared", "functions"):
        for path in (REPO / folder).rglob("*.py"):
            names |= set(USE.findall(path.read_text()))
    return names


def test_every_query_the_code_uses_exists() -> None:
    missing = used_names() - set(QUERIES)
    assert not missing, f"used but not in queries.sql: {sorted(missing)}"


def test_every_query_defined_is_used() -> None:
    unused = set(QUERIES) - used_names()
    assert not unused, f"defined in queries.sql but never used: {sorted(unused)}"


def test_unknown_name_says_which() -> None:
    with pytest.raises(KeyError, match="no_such_query"):
        QUERIES["no_such_query"]


def test_parser_rejects_duplicates_and_empty_blocks() -> None:
    with pytest.raises(ValueError, match="twice"):
        Queries("-- a --\n-- d\nSELECT 1;\n-- a --\n-- d\nSELECT 2;\n")
    with pytest.raises(ValueError, match="empty"):
        Queries("-- a --\n-- only a description\n")


def test_fenced_writes_carry_the_fence() -> None:
    """Every write after a claim names the attempt and checks the lease against the clock
    of the moment the row is checked (``now()`` is the transaction's start: a write that
    waited on a lock past its lease would still match)."""
    names = [n for n in QUERIES if n.startswith("attempt_")]
    assert len(names) >= 7
    for name in names:
        sql = QUERIES[name]
        assert "attempt_id = %(attempt_id)s" in sql, name
        assert "visible_at > clock_timestamp()" in sql, name
        assert "visible_at > now()" not in sql, name
        assert "RETURNING" in sql, name


def test_every_block_is_one_statement() -> None:
    for name in QUERIES:
        body = re.sub(r"'[^']*'", "''", QUERIES[name]).strip().rstrip(";")  # no literals
        assert ";" not in body, f"{name} holds more than one statement"
