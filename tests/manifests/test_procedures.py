"""docs/OPERATIONS.md and docs/RUNBOOK.md tell people what to run: every `jobfence` command
in their command blocks exists, with every flag they give it (checked against the command's
own --help)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from jobfence.functions import cli as entry
from tests.support import REPO

DOCS = [REPO / "docs" / "OPERATIONS.md", REPO / "docs" / "RUNBOOK.md"]
CALL = re.compile(r"\bjobfence ([a-z][a-z-]*)([^|;#`\n]*)")


def commands() -> list[tuple[str, str, list[str]]]:
    """(doc, command, flags) of each call in an indented command block."""
    found = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            if not line.startswith("    "):
                continue
            for name, rest in CALL.findall(line):
                found.append((doc.name, name, re.findall(r"(?<!\S)(--[a-z-]+|-o)\b", rest)))
    return found


def help_of(name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        entry.main([name, "--help"])
    return out.getvalue()


def test_the_procedures_name_commands() -> None:
    named = {name for _, name, _ in commands()}
    assert {"runs", "metrics", "list", "status", "wait", "drain", "queue"} <= named


@pytest.mark.parametrize(("doc", "name", "flags"), commands(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_each_command_exists_with_its_flags(doc: str, name: str, flags: list[str]) -> None:
    assert name in entry.COMMANDS, (doc, name)
    text = help_of(name)
    for flag in flags:
        assert flag in text, (doc, name, flag)
