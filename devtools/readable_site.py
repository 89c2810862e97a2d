"""A copy of some of this environment's distributions that every user can read.

A checkout in a folder only root may enter (as root's home is) keeps its virtualenv there
too: a process the tests start as another user (the postgres user's Patroni, a command
sidecar's uid) cannot import from it. ``copy`` puts the distributions it names — and, for a
package installed in development mode, its source trees — in a root-owned, world-readable
folder under the system's temporary directory, made once per content (a stamp of versions
and files) and shared by every test process of a run.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path


def distributions(root: str, extras: Sequence[str] = ()) -> set[str]:
    """``root`` and every distribution it needs with ``extras``, by name."""
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(root, tuple(extras))]
    while todo:
        name, wanted = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = dist.metadata["Name"].lower()
        if key in seen:
            continue
        seen.add(key)
        for req in dist.requires or ():
            spec, _, marker = req.partition(";")
            if marker and not any(_marker_holds(marker, e) for e in ("", *wanted)):
                continue
            dep = re.split(r"[\s\[<>=!~(]", spec.strip(), maxsplit=1)[0]
            inner = re.search(r"\[([^\]]*)\]", spec)
            todo.append((dep, tuple(e.strip() for e in inner.group(1).split(","))
                         if inner else ()))
    return seen


def _marker_holds(marker: str, extra: str) -> bool:
    from packaging.markers import Marker
    return bool(Marker(marker).evaluate({"extra": extra}))


def others_may_enter(path: str) -> bool:
    """Whether every folder above ``path`` lets other users through."""
    p = Path(path).resolve()
    return all(q.stat().st_mode & 0o001 for q in (p, *p.parents))


def _tree_files(trees: Mapping[str, Path]) -> list[tuple[str, Path]]:
    files = []
    for target, top in sorted(trees.items()):
        for d, dirs, names in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for name in sorted(names):
                if not name.endswith(".pyc"):
                    src = Path(d) / name
                    files.append((str(Path(target) / src.relative_to(top)), src))
    return files


def copy(prefix: str, names: Sequence[str], trees: Mapping[str, Path] | None = None) -> str:
    """A world-readable folder holding the distributions ``names`` (their installed files)
    and the source ``trees`` (folder in the copy → folder here, e.g. a package installed in
    development mode), for ``site.addsitedir``."""
    tree_files = _tree_files(trees or {})
    stamp = hashlib.sha256()
    for n in sorted(names):
        stamp.update(f"{n}={metadata.version(n)}\n".encode())
    for target, src in tree_files:
        st = src.stat()
        stamp.update(f"{target}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    dest = Path(tempfile.gettempdir()) / f"{prefix}-{stamp.hexdigest()[:16]}"
    if (dest / ".complete").exists():
        return str(dest)
    work = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    for name in names:
        for f in metadata.distribution(name).files or ():
            src = Path(str(f.locate()))
            # a development install's hooks point back into the checkout: its trees instead
            if src.is_file() and not str(f).startswith(("..", "__editable__")):
                target = work / str(f)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
    for rel, src in tree_files:
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    for d, _, files in os.walk(work):
        os.chmod(d, 0o755)  # noqa: S103 - read-only for others, by design (see above)
        for name in files:
            os.chmod(os.path.join(d, name), 0o644)
    (work / ".complete").touch()
    try:
        work.rename(dest)
    except OSError:  # made meanwhile by another test process
        shutil.rmtree(work, ignore_errors=True)
    return str(dest)
