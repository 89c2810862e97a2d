"""docs/REFERENCE.md is the product's own reference: what it says about entrypoints, commands,
exit codes, schedules and settings is what the code and the manifests do."""

from __future__ import annotations

import re

from devtools.reference import REFERENCE, render
from jobfence.errors import ExitCode
from jobfence.functions.cli import COMMANDS
from jobfence.settings import Settings
from tests.support.manifests import PERIODIC

TEXT = REFERENCE.read_text()


def entrypoints() -> dict[str, str]:
    """name → 'started by' from the entrypoints table."""
    rows = re.findall(r"^\| `([a-z-]+)` \| jobfence\.functions\.\S+ \| ([^|]+)\|", TEXT,
                      re.MULTILINE)
    return {name: started.strip() for name, started in rows}


def test_the_entrypoints_are_the_commands_and_their_modules_exist() -> None:
    table = entrypoints()
    assert table and set(table) <= set(COMMANDS)
    for name in table:
        module = COMMANDS[name][0].split(":")[0]
        assert f"| `{name}` | jobfence.functions.{module} |" in TEXT


def test_the_periodic_functions_are_the_cronjobs_on_their_schedules() -> None:
    table = entrypoints()
    assert {n for n, started in table.items() if started.startswith("CronJob")} \
        == set(PERIODIC)
    every = {"* * * * *": "every minute", "*/2 * * * *": "every 2 minutes",
             "*/5 * * * *": "every 5 minutes", "*/10 * * * *": "every 10 minutes"}
    for name, schedule in PERIODIC.items():
        assert every[schedule] in table[name], (name, schedule)


def test_every_command_is_documented() -> None:
    for name in COMMANDS:
        assert re.search(rf"^jobfence {re.escape(name)}\b|[|] {re.escape(name)}\b|"
                         rf"`{re.escape(name)}`", TEXT, re.MULTILINE), name


def test_every_exit_code_is_in_the_table() -> None:
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \| \S", TEXT, re.MULTILINE), code


def test_the_settings_table_is_generated_from_the_settings() -> None:
    assert render(TEXT) == TEXT, "run `python -m devtools.reference` and review the diff"
    for field in Settings.model_fields:
        env = "JOBFENCE_SCHEMA" if field == "schema_name" else f"JOBFENCE_{field.upper()}"
        assert f"| `{env}` |" in TEXT, env
