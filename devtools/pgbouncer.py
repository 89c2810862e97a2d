"""A throwaway PgBouncer in front of a PostgreSQL server, for tests, the demo and the
benchmarks: the Debian package's ``pgbouncer`` binary, a config in a temporary directory,
a free loopback port, every database of the server reachable under its own name.

Transaction pooling by default (what platform teams run in front of a primary): a server
connection is lent to a client for one transaction at a time, so nothing a client sets on
its session survives to its next transaction.

PgBouncer refuses to run as root; when this process is root it runs as the ``postgres``
user, in a directory handed over to it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self
from urllib.parse import urlsplit

from devtools.embedded_pg import ThrowawayServer, free_port


class PgBouncerError(RuntimeError):
    pass


def find_pgbouncer() -> str:
    for candidate in (shutil.which("pgbouncer"), "/usr/sbin/pgbouncer"):
        if candidate and Path(candidate).exists():
            return candidate
    raise PgBouncerError("pgbouncer not found; install it (Debian: apt-get install -y "
                         "pgbouncer)")


class PgBouncer(ThrowawayServer):
    """One PgBouncer. ``server`` is the URL of the PostgreSQL server behind it (host and
    port are used; every database name is forwarded)."""

    def __init__(self, server: str, *, pool_mode: str = "transaction",
                 default_pool_size: int = 20, max_client_conn: int = 1000,
                 port: int | None = None, connect_query: str | None = None,
                 users: Sequence[str] = ()) -> None:
        """``connect_query`` runs on every server connection PgBouncer opens (the tests set
        a search path with it, for their own plain-SQL looks into the tables; jobfence
        itself names its schema in every statement). ``users`` may log in too, each
        reaching the server as itself (the server's own user otherwise)."""
        self.binary = find_pgbouncer()
        parts = urlsplit(server)
        self.server_host = parts.hostname or "127.0.0.1"
        self.server_port = parts.port or 5432
        self.server_user = parts.username or "postgres"
        self.server_password = parts.password
        self.connect_query = connect_query
        self.users = tuple(users)
        self.pool_mode = pool_mode
        self.default_pool_size = default_pool_size
        self.max_client_conn = max_client_conn
        self.port = port or free_port()
        super().__init__("jobfence-pgbouncer-")
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str) -> str:
        return f"postgresql://{self.server_user}@127.0.0.1:{self.port}/{dbname}"

    def _config(self) -> str:
        auth = self.root / "users.txt"
        auth.write_text("".join(f'"{u}" ""\n' for u in (self.server_user, *self.users)))
        return "\n".join([
            "[databases]",
            f"* = {self._server()}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {auth}",
            f"pool_mode = {self.pool_mode}",
            f"default_pool_size = {self.default_pool_size}",
            f"max_client_conn = {self.max_client_conn}",
            "server_reset_query = DISCARD ALL",
            "server_check_delay = 0",
            "server_login_retry = 1",
            "ignore_startup_parameters = extra_float_digits",
            f"logfile = {self.root / 'pgbouncer.log'}",
            "log_connections = 0",
            "log_disconnections = 0",
            "", ""])

    def _server(self) -> str:
        params = [f"host={self.server_host}", f"port={self.server_port}"]
        if not self.users:
            params.append(f"user={self.server_user}")
        if self.server_password and not self.users:
            params.append(f"password={self.server_password}")
        if self.connect_query:
            params.append("connect_query='{}'".format(self.connect_query.replace("'", "''")))
        return " ".join(params)

    def start(self) -> Self:
        ini = self.root / "pgbouncer.ini"
        ini.write_text(self._config())
        if self._run_as:
            for f in self.root.iterdir():
                os.chown(f, self._run_as["user"], self._run_as["group"])
        self._proc = subprocess.Popen([self.binary, str(ini)], cwd=self.root,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      **self._run_as)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise PgBouncerError(f"pgbouncer did not start: {self.log()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.02)
        else:
            self.stop()
            raise PgBouncerError("pgbouncer did not listen within 10 s")
        atexit.register(self.destroy)
        return self

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None


if __name__ == "__main__":  # `python -m devtools.pgbouncer`: where it is, or how to get it
    import sys

    try:
        print("PgBouncer:", find_pgbouncer())
    except PgBouncerError as exc:
        sys.exit(f"error: {exc} (the tests run the store, worker and periodic-function "
                 "suites through it)")
