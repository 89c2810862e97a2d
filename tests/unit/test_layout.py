"""Small, explained modules: none of the shipped code grows past about 400 lines."""

from __future__ import annotations

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
