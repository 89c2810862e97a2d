"""What tests import (fixtures stay in conftest.py): the repository's path, the real CLI as
a subprocess as the login of each command's role, and a test database's URL as jobfence
reaches it (directly or through PgBouncer).

The package's modules, each on one subject, hold the rest of what more than one test module
uses — a test module never imports another: ``pg`` (where the tests get PostgreSQL),
``factories`` (jobs, datum parents, the test plugin), ``procs`` (real worker processes, the
command sidecar), ``api_client`` (the HTTP API in-process), ``kube`` (the real control
plane), ``schema_dump``, ``lifecycle`` (the lifecycle pass on an injected clock), ``races``,
``reconciliation`` (of the local cluster), ``hostile`` (a job's search for keys),
``manifests`` (the rendered base, its RBAC and policies, PromQL) and ``keda`` (a pool's
trigger as KEDA applies it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from devtools import REPO, image
from devtools.pgbouncer import PgBouncer
from devtools.roles import BOOTSTRAP, as_login, ensure_logins, login_name
from jobfence.db import Connection
from jobfence.store import Store
from jobfence.store.roles import ROLE_OF_COMMAND, role_names
from tests.support.pg import with_db

__all__ = ["JOBFENCE", "REPO", "Dsn", "built_image", "cli_env", "role_dsn", "run_cli",
           "through"]

JOBFENCE = [sys.executable, "-m", "jobfence.functions.cli"]

SLOW_COMMIT = """
CREATE TABLE public.commit_pause (id int);
CREATE FUNCTION public.commit_pause() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.commit_pause) THEN
    PERFORM pg_sleep(2);
  END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER commit_pause AFTER INSERT OR UPDATE ON jobs
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.commit_pause();
"""
"""Installed in a test's database: while ``public.commit_pause`` holds a row, the COMMIT of
any transaction that wrote a job waits 2 s (a deferred trigger) — time for a test to lose
its answer, or to terminate its backend in the middle of it."""


def lose_next_answer(conn: Connection, on: Store, abort: bool = False) -> threading.Thread:
    """The next statement on ``on``'s connection commits (held 2 s in its COMMIT), and its
    answer is lost: the client's socket is shut for reading while the server still commits.
    With ``abort``, its backend is terminated there instead: it never commits."""
    conn.execute(SLOW_COMMIT)
    conn.execute("INSERT INTO public.commit_pause VALUES (1)")
    fd = on.conn.pgconn.socket
    pid = on.conn.info.backend_pid

    def cut() -> None:
        time.sleep(0.7)
        conn.execute("DELETE FROM public.commit_pause")  # later statements commit at once
        if abort:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            return
        with socket.socket(fileno=os.dup(fd)) as s:
            s.shutdown(socket.SHUT_RD)

    t = threading.Thread(target=cut)
    t.start()
    return t


class Dsn(str):
    """A test database's URL as jobfence reaches it, with the pooler in between (``none``:
    direct) and the server's own URL (``direct``)."""

    pooler: str = "none"
    direct: str = ""


def through(bouncer: PgBouncer, url: str) -> Dsn:
    """The database at ``url``, reached through ``bouncer`` (in transaction mode)."""
    out = Dsn(with_db(bouncer.url("postgres"), conninfo_to_dict(url)["dbname"]))
    out.pooler = "transaction"
    out.direct = url
    return out


_with_logins: set[tuple[str, str]] = set()
"""(server, schema) pairs whose role logins exist."""


def role_dsn(dsn: str, command: str, schema: str = "jobfence") -> str:
    """``dsn`` as the login of ``command``'s role (``jobfence.store.roles``), as a
    deployment runs it; ``dsn`` itself for the bootstrap migrate, for a URL that names
    another login already, or while the schema's roles do not exist yet."""
    params = conninfo_to_dict(dsn)
    if command not in ROLE_OF_COMMAND or command in BOOTSTRAP \
            or str(params.get("user", "")).endswith("_login"):
        return dsn
    key = (f"{params.get('host')}:{params.get('port')}", schema)
    if key not in _with_logins:
        admin = getattr(dsn, "direct", "") or dsn
        try:
            with psycopg.connect(admin, autocommit=True, connect_timeout=2) as c:
                exists = c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                   (role_names(schema)["reader"],)).fetchone()
        except psycopg.Error:  # a test of an unreachable or unusable server
            return dsn
        if not exists:
            return dsn
        ensure_logins(admin, schema)
        _with_logins.add(key)
    out = Dsn(as_login(dsn, login_name(schema, ROLE_OF_COMMAND[command])))
    out.pooler = getattr(dsn, "pooler", "none")
    direct = getattr(dsn, "direct", "")
    out.direct = as_login(direct, login_name(schema, ROLE_OF_COMMAND[command])) if direct else ""
    return out


def cli_env(dsn: str, command: str | None = None, **extra: str) -> dict[str, str]:
    """The CLI's environment: ``dsn`` as the login of ``command``'s role when given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    env.pop("PYTHONPATH", None)  # the installed package, not the repository's folders
    if command is not None:
        dsn = role_dsn(dsn, command, extra.get("JOBFENCE_SCHEMA", "jobfence"))
    env.update({"JOBFENCE_DATABASE_URL": dsn,
                "JOBFENCE_DATABASE_POOLER": getattr(dsn, "pooler", "none"),
                # Commands of most tests write where the test looks (its tmp_path, which only
                # root may enter): they keep the worker's user unless a test asks otherwise.
                "JOBFENCE_COMMAND_USER": "worker", **extra})
    return env


def run_cli(dsn: str, *args: str, input: str | None = None, timeout: float = 60,
            **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI as a subprocess, as the login of the command's role."""
    return subprocess.run([*JOBFENCE, *args], env=cli_env(dsn, args[0] if args else None, **env),
                          cwd=REPO, input=input, capture_output=True, text=True,
                          timeout=timeout, check=False)


def built_image(name: str = image.DEFAULT_IMAGE) -> image.Built:
    """The one image, as `make image` builds it: built once (minutes the first time: the
    local base, the wheels, the build), then found by the hash of its inputs by every later
    session and test process (the build is locked). A machine with no builder fails the
    test with the line that says what to install."""
    try:
        return image.build(name, quiet=True)
    except image.ImageError as exc:
        pytest.fail(f"make image: {exc}", pytrace=False)
