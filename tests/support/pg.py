"""Where the tests get PostgreSQL from, in this order:

1. ``JOBFENCE_TEST_DATABASE_URL`` (a server the tests may create databases on);
2. testcontainers, if a Docker daemon answers a ping within 3 s;
3. a throwaway cluster from the local server binaries (devtools.embedded_pg).

One template database is migrated once per session; each test gets a fresh database
copied from it (``CREATE DATABASE ... TEMPLATE``, about 25 ms).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from devtools.sqlconn import connect
from jobfence.store.migrations import migrate


def with_db(url: str, dbname: str) -> str:
    return make_conninfo(url, dbname=dbname)


def _docker_answers() -> bool:
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False  # no daemon socket at all: do not even import the client
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=3)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False
        finally:
            gc.collect()


@contextlib.contextmanager
def postgres_server() -> Iterator[tuple[str, Any]]:
    """(server url, handle): handle is the embedded cluster when one was started."""
    url = os.environ.get("JOBFENCE_TEST_DATABASE_URL")
    if url:
        yield url, None
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:15-alpine", driver=None) as pg:
            yield pg.get_connection_url(), None
        return
    from devtools.embedded_pg import EmbeddedPostgres

    with EmbeddedPostgres(**pods_reach()) as pg:
        yield pg.dsn, pg


def pods_reach() -> dict[str, Any]:
    """In a test session whose cluster has a real node (its network namespace, which this
    process runs in), the server listens on the node's bridge too and lets its pods in: the
    pods of the tests' installations reach each test's database there."""
    if not os.environ.get("JOBFENCE_TEST_CLUSTER_NETNS"):
        return {}
    from devtools.cluster import network

    return {"listen": ("127.0.0.1", network.GATEWAY), "trust": (network.POD_SUBNET,)}


class Databases:
    """Creates per-test databases from one migrated template."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.prefix = f"jf_test_{os.getpid()}"
        self.template = f"{self.prefix}_template"
        self._ids = itertools.count()
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.template}"')
            admin.execute(f'CREATE DATABASE "{self.template}"')
        conn = connect(with_db(server_url, self.template))
        try:
            migrate(conn)
        finally:
            conn.close()

    def create(self, *, migrated: bool = True) -> str:
        name = f"{self.prefix}_{next(self._ids)}"
        template = self.template if migrated else "template0"
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return with_db(self.server_url, name)

    def drop(self, url: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
