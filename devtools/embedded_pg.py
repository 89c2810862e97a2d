"""A throwaway PostgreSQL cluster from the local server binaries, for tests, the demo and
the benchmarks: ``initdb`` into a temporary directory, ``pg_ctl start`` on a free loopback
port, stopped (and deleted) on exit.

PostgreSQL refuses to run as root; when this process is root the server runs as the
``postgres`` user, in a directory handed over to it.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self


class EmbeddedPostgresError(RuntimeError):
    pass


def find_bindir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` live: $JOBFENCE_PG_BINDIR, pg_config, Debian's
    /usr/lib/postgresql/N/bin (newest), or PATH."""
    candidates: list[str] = []
    if os.environ.get("JOBFENCE_PG_BINDIR"):
        candidates.append(os.environ["JOBFENCE_PG_BINDIR"])
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            candidates.append(subprocess.run([pg_config, "--bindir"], capture_output=True,
                                             text=True, check=True).stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit()
                         else 0, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).parent))
    for c in candidates:
        if (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    raise EmbeddedPostgresError(
        "no PostgreSQL server binaries found (initdb, pg_ctl); install them "
        "(Debian: apt-get install -y postgresql) or set JOBFENCE_PG_BINDIR")


_PORTS = random.SystemRandom()  # not the seeded generator a chaos run replays


def free_port() -> int:
    """A free port below the kernel's ephemeral range. A server that is restarted gives its
    port up while it is down; every ``bind(("", 0))`` of another process (an HTTP server,
    moto, a fake API) draws from the ephemeral range and could take it meanwhile — then the
    restarted server's clients would reach another one. Below the range, only another
    server chosen the same way could, one chance in some ten thousand."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first = max(1024, min(low, 32768) - 12_000)
    for _ in range(200):
        port = _PORTS.randrange(first, min(low, 32768))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        found: int = s.getsockname()[1]
        return found


class ThrowawayServer:
    """A server process living in a temporary directory that ``destroy`` deletes, run as
    the ``postgres`` user (which owns the directory) when this process is root."""

    def __init__(self, prefix: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self._run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class EmbeddedPostgres(ThrowawayServer):
    """One local cluster. ``durable=False`` turns off fsync and friends: fine for tests and
    demos, never for data anyone wants to keep."""

    def __init__(self, *, durable: bool = False, port: int | None = None,
                 max_connections: int = 300, settings: dict[str, str] | None = None,
                 listen: tuple[str, ...] = ("127.0.0.1",), trust: tuple[str, ...] = ()
                 ) -> None:
        """``listen``: the addresses it listens on; ``trust``: networks (CIDR) besides
        loopback whose clients it lets in without a password (a local cluster's pods)."""
        self.bindir = find_bindir()
        self.listen, self.trust = listen, trust
        self.durable = durable
        self.port = port or free_port()
        self.max_connections = max_connections
        self.extra = settings or {}
        super().__init__("jobfence-pg-")
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self._started = False

    @property
    def dsn(self) -> str:
        return self.url("postgres")

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bindir / args[0]), *args[1:]], cwd=self.root,
                              capture_output=True, text=True, check=check, **self._run_as)

    def _options(self) -> str:
        opts = {
            "listen_addresses": ",".join(self.listen),
            "unix_socket_directories": str(self.root),
            "max_connections": str(self.max_connections),
            **({} if self.durable else {
                "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}),
            **self.extra,
        }
        return " ".join([f"-p {self.port}", *(f"-c {k}={v}" for k, v in opts.items())])

    def start(self) -> Self:
        if not (self.data / "PG_VERSION").exists():
            try:
                self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                          "-E", "UTF8", "--locale=C", "-N")
            except subprocess.CalledProcessError as exc:
                raise EmbeddedPostgresError(f"initdb failed: {exc.stderr.strip()}") from exc
            if self.trust:
                with open(self.data / "pg_hba.conf", "a") as hba:
                    hba.writelines(f"host all all {net} trust\n" for net in self.trust)
        try:
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w",
                      "-t", "30", "-o", self._options(), "start")
        except subprocess.CalledProcessError as exc:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise EmbeddedPostgresError(
                f"PostgreSQL did not start: {exc.stderr.strip()}\n{log[-2000:]}") from exc
        self._started = True
        atexit.register(self.destroy)
        return self

    def stop(self, mode: str = "fast") -> None:
        if self._started:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop",
                      check=False)
            self._started = False

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stop (immediate: like a crash) and start again on the same port."""
        self.stop(mode="immediate")
        if down_seconds:
            time.sleep(down_seconds)
        self.start()
