"""Named SQL: every statement lives in the `.sql` file of the store noun that runs it, under
the name of the method that runs it; every name the code uses exists; every statement is
used, and is one statement; every write after a claim carries the fence."""

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
NOUNS: list[type[Noun]] = sorted(Noun.__subclasses__(), key=lambda n: n.sql_file)
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
        p.name for p in STORE.glob("*.sql") if p.name not in ("migrations.sql", "roles.sql")}
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


WORKER_FUNCTION = re.compile(r"CREATE FUNCTION (worker_\w+)\((.*?)\$\$(.*?)\$\$;", re.S)


def worker_functions() -> dict[str, str]:
    """The worker's functions (migration 0014), by name: their bodies."""
    text = (STORE / "schema" / "0014_least_privilege.sql").read_text()
    return {m[1]: m[2] + m[3] for m in WORKER_FUNCTION.finditer(text)}


def test_fenced_writes_carry_the_fence() -> None:
    """Every write after a claim names the attempt and checks the lease against the clock
    of the moment the row is checked (``now()`` is the transaction's start: a write that
    waited on a lock past its lease would still match) — inside the database, in the
    worker's functions, which are all the worker's role may run."""
    sql = queries("jobfence.store", "attempts.sql", "jobfence")
    for name in sql:
        assert f"worker_{name}(" in sql[name], name
        if name != "claim":
            assert "%(attempt_id)s::uuid" in sql[name], name
    functions = worker_functions()
    writes = [n for n in functions if n not in ("worker_claim", "worker_fence",
                                                 "worker_done_actions")]
    assert len(writes) >= 7
    for name in writes:
        body = functions[name]
        assert "attempt_id = p_attempt_id" in body, name
        assert "visible_at > clock_timestamp()" in body, name
        assert "visible_at > now()" not in body, name
        assert "SECURITY DEFINER SET search_path FROM CURRENT" in body, name


def test_no_worker_function_returns_a_fence() -> None:
    """A worker's role can read its own claim's attempt_id (the claim returns it) and no
    other: nothing else a worker function returns carries one."""
    for name, body in worker_functions().items():
        returns = body.split("RETURNS", 1)[1].split("LANGUAGE", 1)[0]
        assert ("attempt_id" in returns) == (name == "worker_claim"), name


def test_every_block_is_one_statement() -> None:
    for noun in NOUNS:
        sql = queries("jobfence.store", noun.sql_file, "jobfence")
        for name in sql:
            body = re.sub(r"'[^']*'", "''", sql[name]).strip().rstrip(";")  # no literals
            assert ";" not in body, f"{noun.sql_file}: {name} holds more than one statement"


def test_every_table_is_named_with_the_schema() -> None:
    """No statement can reach a table of the caller's search path (an application's own
    `jobs`): every jobfence table and function is qualified."""
    objects = ("jobs", "job_events", "job_dependencies", "job_action_results", "job_outputs",
               "function_runs", "function_totals", "function_status", "orphan_pod_suspects",
               "jobfence_control", "jobfence_schema_migrations")
    bare = re.compile(r"\b(FROM|JOIN|UPDATE|INTO)\s+(" + "|".join(objects) + r")\b")
    for path in STORE.glob("*.sql"):
        text = path.read_text()
        assert not bare.search(text), f"{path.name}: {bare.search(text)}"
