"""docs/DEVELOPERS.md's tables are the map a newcomer reads first: every module of the
package is named there (by its path, or by its file name on a line that names its folder),
and every path the guide names exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import REPO

GUIDE = REPO / "docs" / "DEVELOPERS.md"
PATH = re.compile(r"^(?:shared|functions|devtools|tests|bench|manifests|demo)/[\w./-]*\w$")


def modules() -> list[Path]:
    return sorted(p.relative_to(REPO) for root in ("shared", "functions")
                  for p in (REPO / root).rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def test_every_module_of_the_package_is_named_in_the_guide() -> None:
    lines = GUIDE.read_text().splitlines()
    unnamed = [str(m) for m in modules()
               if not any(str(m) in line or (f"`{m.name}`" in line and f"{m.parent}/" in line)
                          for line in lines)]
    assert not unnamed, f"modules docs/DEVELOPERS.md does not name: {unnamed}"


def test_every_path_the_guide_names_exists() -> None:
    named = {part for quoted in re.findall(r"`([^`]+)`", GUIDE.read_text())
             for part in re.split(r"[\s,()+:]+", quoted) if PATH.match(part)}
    assert named, "the guide names no path: the pattern is wrong"
    gone = sorted(n for n in named if not (REPO / n.rstrip("/")).exists()
                  and "<" not in n and "*" not in n)
    assert not gone, f"docs/DEVELOPERS.md names paths that do not exist: {gone}"
