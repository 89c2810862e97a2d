"""Named SQL: every statement lives in the `.sql` file of the store noun that runs it, under
the name of the method that runs it; every name the code uses exists; every statement is
used, and is one statement; every write after a claim carries the fence (the installed
schema's side of both, read from the catalog: tests/integration/test_definer_functions.py)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from jobfence.db import Queries, queries
from jobfence.store import Store
from jobfence.store.base import Noun

STORE = Path(inspect.getfile(Store)).parent


def _nouns(of: type[Noun]) -> list[type[Noun]]:
    """Every noun with statements of its own (a base like ``Settling`` has none)."""
    below = [n for sub in of.__subclasses__() for n in _nouns(sub)]
    return [of, *below] if "sql_file" in vars(of) else below


NOUNS: list[type[Noun]] = sorted(_nouns(Noun), key=lambda n: n.sql_file)
RUNNERS = {"_execute", "_one", "_all", "_rows", "_row", "_count"}


def used(module: Path) -> set[str]:
    """Statement names a module runs: literal first arguments of the noun's helpers,
    ``self.sql["name"]`` and ``db.queries(...)["name"]``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in RUNNERS and node.args \
                and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and (
                (isinstance(node.value, ast.Attribute) and node.value.attr == "sql")
                or (isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                    and node.value.func.attr == "queries")):
            names.add(str(node.slice.value))
    return names


def test_every_noun_has_its_sql_file_beside_it() -> None:
    assert {n.sql_file for n in NOUNS} == {
        p.name for p in STORE.glob("*.sql")
        if p.name not in ("migrations.sql", "roles.sql") and not p.name.endswith(".functions.sql")}
    for noun in NOUNS:
        assert (STORE / noun.sql_file.replace(".sql", ".py")).exists(), noun


@pytest.mark.parametrize("noun", NOUNS, ids=lambda n: n.sql_file)
def test_each_statement_is_named_like_the_method_that_runs_it(noun: type[Noun]) -> None:
    names = set(queries("jobfence.store", noun.sql_file, "jobfence"))
    methods = {name for name, _ in inspect.getmembers(noun, inspect.isfunction)}
    assert names <= methods, f"{noun.sql_file}: no method named {sorted(names - methods)}"


def test_every_name_used_exists_and_every_statement_is_used() -> None:
    used_by_file: dict[str, set[str]] = {}
    for noun in NOUNS:
        used_by_file.setdefault(noun.sql_file, set()).update(
            used(STORE / noun.sql_file.replace(".sql", ".py")))
    for sql_file, names in used_by_file.items():
        defined = set(queries("jobfence.store", sql_file, "jobfence"))
        assert names <= defined, f"{sql_file}: unknown {sorted(names - defined)}"
        assert defined <= names, f"{sql_file}: never used {sorted(defined - names)}"


def test_an_unknown_name_says_which_file() -> None:
    with pytest.raises(KeyError, match=r"no query named 'no_such_query' in jobs\.sql"):
        queries("jobfence.store", "jobs.sql", "jobfence")["no_such_query"]


def test_parser_rejects_duplicates_and_empty_blocks() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        Queries("-- a --\n-- d\nSELECT 1;\n-- a --\n-- d\nSELECT 2;\n")
    with pytest.raises(ValueError, match="empty"):
        Queries("-- a --\n-- only a description\n")


def test_the_schema_is_filled_in_as_a_quoted_identifier() -> None:
    q = Queries("-- a --\n-- d\nSELECT * FROM {schema}.jobs WHERE x = '{{}}';\n",
                schema="tenant_b")
    assert q["a"] == "SELECT * FROM \"tenant_b\".jobs WHERE x = '{}'"
    with pytest.raises(Exception, match="plain lower-case identifier"):
        Queries("-- a --\n-- d\nSELECT 1;\n", schema='x"; DROP TABLE jobs; --')


def test_fenced_writes_carry_the_fence() -> None:
    """Every statement of the worker but the claim and the look at when the next job is due
    names the attempt it acts for and runs one of the worker's functions (which check the
    fence inside the database: their installed bodies are read from the catalog in
    tests/integration/test_definer_functions.py)."""
    sql = queries("jobfence.store", "attempts.sql", "jobfence")
    for name in sql:
        assert f"worker_{name}(" in sql[name], name
        if name not in ("claim", "next_due"):  # next_due: when, never which job
            assert ("%(attempt_id)s::uuid" in sql[name]
                    or "%(attempt_ids)s::uuid[]" in sql[name]
                    # each row of a batch of terminal writes names its attempt
                    or (name == "finish_many" and "%(rows)s::jsonb" in sql[name])
                    # a claim whose answer was lost is named by the claim's own id
                    or (name == "release_claim" and "%(claim_id)s::uuid" in sql[name])), name


def test_every_block_is_one_statement() -> None:
    for noun in NOUNS:
        sql = queries("jobfence.store", noun.sql_file, "jobfence")
        for name in sql:
            body = re.sub(r"'[^']*'", "''", sql[name]).strip().rstrip(";")  # no literals
            assert ";" not in body, f"{noun.sql_file}: {name} holds more than one statement"

