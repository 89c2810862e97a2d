"""Migrations: a fresh migrate produces exactly the expected schema; running it again, or
from two processes at once, is harmless."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from devtools.sqlconn import connect
from jobfence.store.migrations import available, migrate
from tests.conftest import JOBFENCE, REPO, cli_env
from tests.pg import Databases
from tests.schema_dump import dump

EXPECTED = Path(__file__).with_name("expected_schema.txt")


def test_fresh_migrate_gives_the_expected_schema(databases: Databases) -> None:
    url = databases.create(migrated=False)
    try:
        conn = connect(url)
        report = migrate(conn)
        conn.close()
        assert report.current == len(available())
        actual = dump(url)
        if os.environ.get("JOBFENCE_UPDATE_SCHEMA_SNAPSHOT"):
            EXPECTED.write_text(actual)
        assert actual == EXPECTED.read_text(), (
            "the migrations no longer produce expected_schema.txt; if the change is "
            "intended, run `make schema-snapshot` and review the diff")
    finally:
        databases.drop(url)


def test_migrate_twice_applies_nothing_the_second_time(databases: Databases) -> None:
    url = databases.create(migrated=False)
    try:
        conn = connect(url)
        first = migrate(conn)
        second = migrate(conn)
        conn.close()
        assert len(first.applied) == len(available())
        assert second.applied == () and second.current == first.current
    finally:
        databases.drop(url)


def test_migrate_from_two_processes_at_once(databases: Databases) -> None:
    url = databases.create(migrated=False)
    try:
        procs = [subprocess.Popen([*JOBFENCE, "migrate"], env=cli_env(url), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        applied = sorted(len(__import__("json").loads(o)["applied"]) for o, _ in outs)
        assert applied == [0, len(available())]
        assert dump(url) == EXPECTED.read_text()
    finally:
        databases.drop(url)
