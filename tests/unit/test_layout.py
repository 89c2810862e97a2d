"""Small, explained modules: none of the shipped code grows past about 400 lines."""

from __future__ import annotations

from tests.conftest import REPO

LIMIT = 420


def test_no_module_is_longer_than_about_400_lines() -> None:
    long = {str(p.relative_to(REPO)): n for folder in ("shared", "functions")
            for p in (REPO / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LIMIT}
    assert long == {}
