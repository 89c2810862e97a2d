"""Mirror the installed package layout (``jobfence`` from shared/, ``jobfence.functions``
from functions/, as pyproject.toml's ``package-dir`` maps them) as a tree of symlinks under
``build/src``, for the tools that read packages from directories — mypy and import-linter —
rather than through the editable install's import hook.

    python -m devtools.linktree     # prints the tree's root
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

from devtools import REPO

SUFFIXES = (".py", ".pyi", ".typed")


def build(dest: Path = REPO / "build" / "src") -> Path:
    mapping: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-dir"]
    if dest.exists():
        shutil.rmtree(dest)
    for package, folder in mapping.items():
        root = dest.joinpath(*package.split("."))
        source = REPO / folder
        for path in source.rglob("*"):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix not in SUFFIXES:
                continue
            target = root / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    return dest


if __name__ == "__main__":
    print(build())
    sys.exit(0)
