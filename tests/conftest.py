"""Fixtures shared by every layer: a real PostgreSQL (see tests/pg.py), a fresh migrated
database per test, and the fenced store over it."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.s3 import moto_server
from devtools.sqlconn import connect
from jobfence.db import Connection
from jobfence.store import Store
from tests.pg import Databases, postgres_server

REPO = Path(__file__).resolve().parent.parent
JOBFENCE = [sys.executable, "-m", "jobfence.functions.cli"]


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
def store(conn: Connection) -> Store:
    return Store(conn)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 in server mode on 127.0.0.1, shared by the session (buckets per test)."""
    with moto_server() as endpoint:
        yield endpoint


_buckets = itertools.count()


@pytest.fixture
def s3_env(s3_endpoint: str) -> dict[str, str]:
    """Settings for a fresh bucket on the moto server, as environment variables."""
    from jobfence.adapters.s3 import S3ObjectStore

    bucket = f"jobfence-test-{os.getpid()}-{next(_buckets)}"
    S3ObjectStore(endpoint_url=s3_endpoint).client.create_bucket(Bucket=bucket)
    return {"JOBFENCE_S3_ENDPOINT_URL": s3_endpoint, "JOBFENCE_S3_BUCKET": bucket,
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def cli_env(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    env.pop("PYTHONPATH", None)  # the installed package, not the repository's folders
    env.update({"JOBFENCE_DATABASE_URL": dsn, **extra})
    return env


def run_cli(dsn: str, *args: str, input: str | None = None, timeout: float = 60,
            **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI as a subprocess."""
    return subprocess.run([*JOBFENCE, *args], env=cli_env(dsn, **env), cwd=REPO, input=input,
                          capture_output=True, text=True, timeout=timeout, check=False)
