"""Small, explained modules: none of the shipped code grows past about 400 lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devtools import linktree
from tests.support import REPO

LIMIT = 420


def test_no_module_is_longer_than_about_400_lines() -> None:
    long = {str(p.relative_to(REPO)): n for folder in ("shared", "functions")
            for p in (REPO / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LIMIT}
    assert long == {}


def test_the_completion_table_names_every_flag_each_command_takes() -> None:
    """``jobfence completion`` offers what each command's ``--help`` lists, no more."""
    import contextlib
    import io
    import re

    from jobfence.commands import COMMANDS
    from jobfence.functions import cli
    from jobfence.functions.completion import FLAGS

    for name in COMMANDS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli.main([name, "--help"])
        flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", out.getvalue())) - {"--help"}
        assert flags == set(FLAGS.get(name, "").split()), name


def test_no_import_cycle_in_the_package_type_only_imports_included(tmp_path: Path) -> None:
    """Each module of jobfence stands on the ones it imports, never on one that imports it
    back — not even for a type (an ``if TYPE_CHECKING:`` import counts): the floors of
    docs/DEVELOPERS.md are an order, not a tangle. Read from the package as installed (its
    entrypoints included), as import-linter reads it."""
    tree = linktree.build(tmp_path / "src")
    found = subprocess.run([sys.executable, "-c", CYCLES], env={**os.environ,
                           "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                           check=True, cwd=tmp_path)
    modules, cycles = json.loads(found.stdout)
    assert len(modules) > 100 and "jobfence.functions.worker" in modules
    assert cycles == []


CYCLES = """
import json, sys
import grimp
sys.setrecursionlimit(10000)
graph = grimp.build_graph("jobfence", exclude_type_checking_imports=False)
index, low, stack, cycles = {}, {}, [], []

def visit(module):  # Tarjan's strongly connected components
    index[module] = low[module] = len(index)
    stack.append(module)
    for imported in graph.find_modules_directly_imported_by(module):
        if imported not in index:
            visit(imported)
            low[module] = min(low[module], low[imported])
        elif imported in stack:
            low[module] = min(low[module], index[imported])
    if low[module] == index[module]:
        component = []
        while True:
            member = stack.pop()
            component.append(member)
            if member == module:
                break
        if len(component) > 1:
            cycles.append(sorted(component))

for module in sorted(graph.modules):
    if module not in index:
        visit(module)
print(json.dumps([sorted(graph.modules), cycles]))
"""


def test_the_checkouts_path_is_defined_once() -> None:
    """``devtools.REPO`` is the one definition the tools, tests, demo and benchmarks use."""
    defined = [str(p.relative_to(REPO)) for folder in ("devtools", "tests", "bench", "demo")
               for p in (REPO / folder).rglob("*.py")
               if any(line.startswith(("REPO =", "REPO:")) for line in p.read_text().splitlines())]
    assert defined == ["devtools/__init__.py"]


def test_every_module_of_the_package_stands_on_one_floor() -> None:
    """The floors contract (pyproject.toml) names every top-level module of jobfence once:
    a new module takes its place in the order, it is not left outside it."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    [floors] = [c for c in config["contracts"] if c.get("containers") == ["jobfence"]]
    named = [m.strip() for layer in floors["layers"]
             for m in layer.replace("\\", " ").replace("|", ":").split(":")]
    shared = REPO / "shared"
    modules = sorted({p.stem for p in shared.glob("*.py") if p.stem != "__init__"}
                     | {p.parent.name for p in shared.glob("*/__init__.py")} | {"functions"})
    assert sorted(named) == modules


def imported_modules(path: Path) -> set[str]:
    """Every module a file of the repository imports, read with ``ast`` (local imports and
    ``if TYPE_CHECKING:`` ones included; a relative import resolved against its package):
    for ``from a.b import c``, both ``a.b`` and ``a.b.c``, as ``c`` may be a module."""
    import ast

    package = list(path.relative_to(REPO).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    """What test modules share lives in tests/support (a shared fixture in the conftest.py
    of its folder), never in a test module another one imports: that would run the imported
    module's fixtures and marks where they were not meant to be, and tie a test to an
    unrelated one's moves."""
    def is_test_module(name: str) -> bool:
        parts = name.split(".")
        return parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:])

    found = {str(p.relative_to(REPO)): sorted(m for m in imported_modules(p)
                                              if is_test_module(m))
             for p in sorted((REPO / "tests").rglob("*.py"))}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_helpers_of_the_tests_are_in_tests_support() -> None:
    """At the top of tests/ only the package's ``__init__.py`` and the fixtures of every
    layer (``conftest.py``): the modules tests import are tests/support's."""
    top = sorted(p.name for p in (REPO / "tests").glob("*.py") if not p.name.startswith("test_"))
    assert top == ["__init__.py", "conftest.py"]
    assert (REPO / "tests" / "support" / "__init__.py").is_file()
    # In a layer's folder, tests and their fixtures only; the job-life model (tests/model)
    # is a package of its own, the rule set the model-based tests run.
    helpers = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("*/*.py")
                     if p.parent.name not in ("support", "model")
                     and not p.name.startswith("test_")
                     and p.name not in ("__init__.py", "conftest.py"))
    assert helpers == [], "helpers of the tests belong in tests/support"
