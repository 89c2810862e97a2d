"""Fixtures shared by every layer: a real PostgreSQL (see tests/pg.py), a fresh migrated
database per test, and the fenced store over it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.db import Connection, connect
from shared.store import FencedStore
from tests.pg import Databases, postgres_server

REPO = Path(__file__).resolve().parent.parent
JOBFENCE = [sys.executable, "-m", "functions.cli"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[tuple[str, Any]]:
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def databases(pg_server: tuple[str, Any]) -> Iterator[Databases]:
    dbs = Databases(pg_server[0])
    yield dbs
    dbs.close()


@pytest.fixture
def dsn(databases: Databases) -> Iterator[str]:
    url = databases.create()
    yield url
    databases.drop(url)


@pytest.fixture
def conn(dsn: str) -> Iterator[Connection]:
    c = connect(dsn)
    yield c
    c.close()


@pytest.fixture
def store(conn: Connection) -> FencedStore:
    return FencedStore(conn)


def cli_env(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    env.update({"JOBFENCE_DATABASE_URL": dsn, "PYTHONPATH": str(REPO), **extra})
    return env


def run_cli(dsn: str, *args: str, input: str | None = None, timeout: float = 60,
            **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI as a subprocess."""
    return subprocess.run([*JOBFENCE, *args], env=cli_env(dsn, **env), cwd=REPO, input=input,
                          capture_output=True, text=True, timeout=timeout, check=False)
