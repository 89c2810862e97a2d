"""Where a database function lives: in its noun's `store/<noun>.functions.sql`, every file
shipped and run by migrate; no migration from 0038 on defines a function, trigger or view
(the catalog side: tests/integration/test_function_files.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from jobfence.store import Store
from jobfence.store.migrations import FUNCTION_FILES, available, function_files

STORE = Path(inspect.getfile(Store)).parent
FILES_FROM = 38
"""The first migration written after the functions moved to their files."""

DEFINES = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?"
                     r"(?:FUNCTION|PROCEDURE|TRIGGER|(?:MATERIALIZED\s+)?VIEW)\b", re.I)


def test_every_function_file_is_run_and_every_one_run_is_shipped() -> None:
    assert {f"{noun}.functions.sql" for noun in FUNCTION_FILES} == {
        p.name for p in STORE.glob("*.functions.sql")}
    assert [f.name for f in function_files()] == [f"{n}.functions.sql" for n in FUNCTION_FILES]
    for noun in FUNCTION_FILES:
        assert (STORE / f"{noun}.py").exists(), f"{noun}.functions.sql has no store module"


def test_no_migration_after_the_move_defines_a_function_trigger_or_view() -> None:
    for mig in available():
        if mig.version >= FILES_FROM:
            found = DEFINES.search(re.sub(r"--[^\n]*", "", mig.sql))
            assert found is None, (
                f"{mig.version:04d}_{mig.name}.sql: {found[0]!r}: a function, trigger or "
                "view belongs in its noun's .functions.sql")


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
