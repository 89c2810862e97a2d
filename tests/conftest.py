"""Fixtures shared by every layer: a real PostgreSQL (see tests/support/pg.py), a fresh
migrated database per test, and the fenced store over it. The helpers tests import (the CLI
as a subprocess, its environment, the repository's path; builders, processes, the control
plane) are in the package tests/support.

A module (or test) marked ``pooled`` runs twice: directly against the server, and through a
real PgBouncer in transaction mode (``JOBFENCE_DATABASE_POOLER=transaction``), which lends a
server connection per transaction. Then ``dsn`` is PgBouncer's URL (a ``Dsn`` that knows
its pooler: ``cli_env`` passes it on to the CLI), ``store`` runs over a connection through
it, and ``conn`` stays a direct connection for the test's own plain-SQL looks."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from devtools import image
from devtools.patroni import PatroniCluster
from devtools.pgbouncer import PgBouncer
from devtools.roles import login_name
from devtools.s3 import moto_server
from devtools.sqlconn import connect
from jobfence import db
from jobfence.db import Connection
from jobfence.store import Store
from jobfence.store.roles import KINDS
from tests.support import Dsn, through
from tests.support.pg import Databases, postgres_server

if TYPE_CHECKING:  # the control plane's helpers are imported when a test needs them
    from tests.support.kube import ControlPlane


@pytest.fixture(scope="session")
def pg_server() -> Iterator[tuple[str, Any]]:
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def databases(pg_server: tuple[str, Any]) -> Iterator[Databases]:
    dbs = Databases(pg_server[0])
    yield dbs
    dbs.close()


POOLER_SEARCH_PATH = "SELECT set_config('search_path', 'jobfence, public', false)"


@pytest.fixture(scope="session")
def pgbouncer(pg_server: tuple[str, Any]) -> Iterator[PgBouncer]:
    """A real PgBouncer in transaction mode in front of the test server."""
    logins = [login_name("jobfence", kind) for kind in KINDS]
    with PgBouncer(pg_server[0], pool_mode="transaction", default_pool_size=20,
                   connect_query=POOLER_SEARCH_PATH, users=logins) as bouncer:
        yield bouncer


@pytest.fixture(scope="module")
def patroni_sync() -> Iterator[PatroniCluster]:
    """A real Patroni cluster (three members, etcd) in the supported setup: one synchronous
    standby that must acknowledge each commit. One per test module: faults change it."""
    cluster = PatroniCluster(synchronous=True)
    try:
        yield cluster.start()
    finally:
        cluster.destroy()


@pytest.fixture(scope="module")
def patroni_async() -> Iterator[PatroniCluster]:
    """The same cluster with Patroni's default asynchronous replication."""
    cluster = PatroniCluster(synchronous=False)
    try:
        yield cluster.start()
    finally:
        cluster.destroy()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "route" in metafunc.fixturenames and metafunc.definition.get_closest_marker("pooled"):
        metafunc.parametrize("route", ["direct", "pgbouncer"], indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Through PgBouncer, the worker fault suite runs in draining mode only: the mode whose
    pipelined finish-and-claim a pooler could break; one-job workers run it directly (the
    suite is the slowest to run twice)."""
    keep, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        mode = params.get("mode")
        if params.get("route") == "pgbouncer" and getattr(mode, "name", "") == "one job":
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture
def route(request: pytest.FixtureRequest) -> str:
    """How jobfence reaches the test database: ``direct``, or ``pgbouncer``."""
    return str(getattr(request, "param", "direct"))


@pytest.fixture
def dsn(databases: Databases, route: str, request: pytest.FixtureRequest) -> Iterator[Dsn]:
    url = databases.create()
    out = Dsn(url)
    out.direct = url
    if route == "pgbouncer":
        out = through(request.getfixturevalue("pgbouncer"), url)
    yield out
    databases.drop(url)


@pytest.fixture
def conn(dsn: Dsn) -> Iterator[Connection]:
    """A direct connection with the schema on its search path, for plain-SQL looks."""
    c = connect(dsn.direct)
    yield c
    c.close()


@pytest.fixture
def store(conn: Connection, dsn: Dsn) -> Iterator[Store]:
    """The store as a function uses it (through the pooler when there is one)."""
    if dsn.pooler == "none":
        yield Store(conn)
        return
    pooled = db.connect(dsn, pooler=dsn.pooler)
    yield Store(pooled)
    pooled.close()


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


# -- the real Kubernetes control plane (tests/support/kube.py) ------------------------------


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the session's main process
        from tests.support.kube import configure_session

        configure_session()


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        from tests.support.kube import end_session

        end_session()


@pytest.fixture(scope="session")
def kube() -> ControlPlane:
    """The session's control plane (one for every test process)."""
    from tests.support.kube import session_cluster

    return session_cluster()


@pytest.fixture(scope="session")
def built_image() -> image.Built:
    """The one image, built by `make image` or here (once per inputs; see
    tests.support.built_image): what the image tests run and a real kubelet pulls."""
    from tests.support import built_image

    return built_image()


@pytest.fixture
def namespace(kube: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own, labelled for the restricted Pod Security Standard;
    deleted afterwards (its pods' processes stop with it)."""
    from tests.support.kube import delete_namespace, new_namespace

    name = new_namespace(kube, request.node.name)
    yield name
    delete_namespace(kube, name)
