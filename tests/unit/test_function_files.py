"""Where a database function lives: in its noun's `store/<noun>.functions.sql`, every file
shipped and run by migrate; no migration defines a function, trigger or view (those before
0038 did when they were shipped: tests/support/shipped_schema keeps them as installed
databases ran them; the catalog side: tests/integration/test_function_files.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from jobfence.store import Store
from jobfence.store.migrations import FUNCTION_FILES, available, function_files
from tests.support.shipped import SHIPPED

STORE = Path(inspect.getfile(Store)).parent
FILES_FROM = 38
"""The first migration written after the functions moved to their files."""

DEFINES = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?"
                     r"(?:FUNCTION|PROCEDURE|TRIGGER|(?:MATERIALIZED\s+)?VIEW)\b"
                     r"|\bALTER\s+(?:FUNCTION|PROCEDURE)\b", re.I)
"""A function, procedure, trigger or view made, or a function's settings changed."""


def test_every_function_file_is_run_and_every_one_run_is_shipped() -> None:
    assert {f"{noun}.functions.sql" for noun in FUNCTION_FILES} == {
        p.name for p in STORE.glob("*.functions.sql")}
    assert [f.name for f in function_files()] == [f"{n}.functions.sql" for n in FUNCTION_FILES]
    for noun in FUNCTION_FILES:
        assert (STORE / f"{noun}.py").exists(), f"{noun}.functions.sql has no store module"


def test_no_migration_defines_a_function_trigger_or_view() -> None:
    for mig in available():
        found = DEFINES.search(re.sub(r"--[^\n]*", "", mig.sql))
        assert found is None, (
            f"{mig.version:04d}_{mig.name}.sql: {found[0]!r}: a function, trigger or view "
            "belongs in its noun's .functions.sql")


def test_the_migrations_as_shipped_are_the_ones_that_defined_functions() -> None:
    """tests/support/shipped_schema holds a migration as it was shipped exactly where the
    shipped text defined what a function file now does, and only from before the move."""
    shipped = {p.name: p.read_text() for p in SHIPPED.glob("*.sql")}
    for mig in available():
        name = f"{mig.version:04d}_{mig.name}.sql"
        if name in shipped:
            assert mig.version < FILES_FROM, name
            assert DEFINES.search(re.sub(r"--[^\n]*", "", shipped.pop(name))), name
    assert shipped == {}, f"no such migration: {sorted(shipped)}"


def test_a_function_file_creates_nothing_it_cannot_create_again() -> None:
    """Run again by every migrate that finds it changed: a plain CREATE FUNCTION or
    CREATE TRIGGER would fail on the second run."""
    for file in function_files():
        code = re.sub(r"--[^\n]*", "", file.sql)
        for m in re.finditer(r"\bCREATE\s+(?!OR\s+REPLACE\b)(FUNCTION|VIEW)\b", code):
            raise AssertionError(f"{file.name}: {m[0]} without OR REPLACE")
        for m in re.finditer(r"\bCREATE\s+TRIGGER\s+(\w+)\s+\w+\s+[\w\s,]*?\s+ON\s+(\S+)", code):
            assert f"DROP TRIGGER IF EXISTS {m[1]} ON {m[2]};" in code, (
                f"{file.name}: trigger {m[1]} is created without being dropped first")
