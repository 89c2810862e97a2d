"""A throwaway Patroni cluster for the failover tests and the failover chaos run: one etcd
and three Patroni members with the local PostgreSQL server binaries, every process on
127.0.0.1 on ports picked free at start, everything in one temporary directory that
``destroy`` deletes.

Two modes. ``synchronous=True`` is the setup jobfence supports (docs/OPERATIONS.md):
``synchronous_mode`` and ``synchronous_mode_strict`` with one synchronous standby, so a
commit is acknowledged only once a second node has it and a failover promotes only that
node. ``synchronous=False`` is Patroni's default asynchronous replication: the positive
control, where an acknowledged commit may be lost with its primary.

The timings are short for tests: ``ttl`` 20 s (Patroni's minimum), ``loop_wait`` 1 s, so a
lost leader is replaced within about 20 s.

Patroni runs its PostgreSQL as its own user, and PostgreSQL refuses root: as root, Patroni
runs as ``postgres``. Its interpreter must then be one the ``postgres`` user may execute:
this process's own when it can, else the system's Python of the same version with this
environment's packages (isolated from the system's ``dist-packages``). etcd runs as this
process's user: it needs no other.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from devtools import readable_site
from devtools.embedded_pg import ThrowawayServer, find_bindir, free_port

PG_SETTINGS = {
    # Enough for a chaos run's workers, sweepers and checkers on every node.
    "max_connections": "300",
    "wal_level": "replica", "hot_standby": "on", "wal_log_hints": "on",
    "max_wal_senders": "10", "max_replication_slots": "10", "wal_keep_size": "256MB",
    # A replica that reconnects after a failover needs its primary's timeline quickly.
    "wal_receiver_status_interval": "1s", "wal_retrieve_retry_interval": "500ms",
    # The faults are process kills and stops, never a machine losing its page cache: what a
    # server wrote survives it without fsync (and the tests run fast on busy cores).
    # Replication is what is tested: a synchronous commit still waits for its standby.
    "fsync": "off",
}


class PatroniError(RuntimeError):
    pass


def find_etcd() -> Path:
    """The etcd the local control plane builds (``make controlplane``), or one on PATH
    (Debian's etcd-server: its v3 API is the one Patroni's ``etcd3`` section speaks)."""
    with contextlib.suppress(Exception):
        from devtools.controlplane import path

        return path("etcd")
    for candidate in ("/usr/bin/etcd", *filter(None, [os.environ.get("JOBFENCE_ETCD")])):
        if Path(candidate).exists():
            return Path(candidate)
    raise PatroniError("no etcd binary: run `make controlplane` (it builds one) or install "
                       "Debian's etcd-server, or set JOBFENCE_ETCD")


def _patroni_command(run_as: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The command that runs Patroni (``-m patroni``) as the server's user, and the
    environment it needs."""
    probe = [sys.executable, "-c", "import patroni"]
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    with contextlib.suppress(OSError):
        if subprocess.run(probe, check=False, capture_output=True, cwd="/", env=env,
                          **run_as, timeout=60).returncode == 0:
            return [sys.executable, "-m", "patroni"], env
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = Path("/usr/bin") / version
    site = _readable_site(run_as)
    if system.exists():
        # -S: none of the system's dist-packages (their pyOpenSSL does not match this
        # environment's cryptography); this environment's packages through PYTHONPATH.
        env = {**env, "PYTHONPATH": site}
        if subprocess.run([str(system), "-S", "-c", "import patroni"], check=False,
                          capture_output=True, cwd="/", env=env, **run_as,
                          timeout=60).returncode == 0:
            return [str(system), "-S", "-m", "patroni"], env
    raise PatroniError(
        "Patroni cannot be run as the postgres user: install the test extras (`make venv`: "
        f"patroni[psycopg3,etcd3]) into an environment that user can read, or provide {system}")


def _readable_site(run_as: dict[str, Any]) -> str:
    """Where the postgres user can import Patroni from: this environment's site-packages
    when that user can read it, else a copy of Patroni's own distributions (not the whole
    environment) in a root-owned, world-readable folder outside a checkout that only root
    may enter (as root's home is), made once per set of versions."""
    site = sysconfig.get_paths()["purelib"]
    if not run_as or (os.access(site, os.R_OK | os.X_OK) and readable_site.others_may_enter(site)):
        return site
    return readable_site.copy("jobfence-patroni-site", sorted(
        readable_site.distributions("patroni", ("psycopg3", "etcd3"))))


def _rest(url: str, body: dict[str, Any] | None = None, *,
          timeout: float = 2) -> dict[str, Any]:
    """GET (or POST ``body`` to) a loopback REST endpoint this module started; its JSON
    answer ({} for a plain-text one). An HTTP error status raises (OSError)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(  # noqa: S310 - loopback URLs this module built
        url, data=data, method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - our loopback URLs
        text = r.read()
    try:
        answer = json.loads(text)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


@dataclass
class Member:
    """One Patroni member: its names, ports, directory and processes."""

    name: str
    pg_port: int
    rest_port: int
    root: Path
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / "patroni.log"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{dbname}"

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid from its pid file (None while it is down)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
            return pid
        return None

    def server_pids(self) -> list[int]:
        """The postmaster and every process it started (backends, walsender...)."""
        top = self.postmaster_pid()
        if top is None:
            return []
        pids = [top]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                if ppid == top:
                    pids.append(int(stat.parent.name))
        return pids


class PatroniCluster(ThrowawayServer):
    """etcd and ``size`` Patroni members. ``start`` returns once a leader accepts writes
    and every replica streams from it (in synchronous mode: one of them synchronously)."""

    def __init__(self, *, synchronous: bool = True, size: int = 3, ttl: int = 20,
                 loop_wait: int = 1, retry_timeout: int = 5,
                 settings: dict[str, str] | None = None) -> None:
        super().__init__("jobfence-patroni-")
        self.synchronous = synchronous
        self.bindir = find_bindir()
        self.etcd_binary = find_etcd()
        self.scope = f"jf{os.getpid()}{self.root.name[-6:]}".lower().replace("_", "")
        self.ttl, self.loop_wait, self.retry_timeout = ttl, loop_wait, retry_timeout
        self.settings = {**PG_SETTINGS, **(settings or {})}
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.members = [Member(f"m{i}", free_port(), free_port(), self.root / f"m{i}")
                        for i in range(size)]
        self._command: list[str] = []
        self._env: dict[str, str] = {}

    # -- addresses ----------------------------------------------------------------------

    def url(self, dbname: str, **params: str) -> str:
        """A multi-host URL naming every member, kept to the writer
        (``target_session_attrs=read-write``) with a short ``connect_timeout``."""
        hosts = ",".join(f"127.0.0.1:{m.pg_port}" for m in self.members)
        query = {"target_session_attrs": "read-write", "connect_timeout": "2", **params}
        return (f"postgresql://postgres@{hosts}/{dbname}?"
                + "&".join(f"{k}={v}" for k, v in query.items()))

    @property
    def dsn(self) -> str:
        return self.url("postgres")

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        self._command, self._env = _patroni_command(self._run_as)
        atexit.register(self.destroy)
        self._start_etcd()
        for m in self.members:
            m.root.mkdir()
            if self._run_as:
                os.chown(m.root, self._run_as["user"], self._run_as["group"])
            self._write_config(m)
        # The first member bootstraps alone, so it is the leader; the others then clone it.
        self.start_member(self.members[0])
        self.wait_until(lambda: self.leader() is not None, 90, "no leader was elected")
        for m in self.members[1:]:
            self.start_member(m)
        self.wait_healthy(120)
        return self

    def stop(self) -> None:
        for m in self.members:
            self._stop_member(m)
        if self.etcd is not None:
            self.etcd.kill()
            self.etcd.wait()
            self.etcd = None
        for pid in self._strays():  # whatever of the cluster outlived the above
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)

    def _strays(self) -> list[int]:
        """Every process started for this cluster: named by its directory (Patroni, etcd,
        the postmasters) or by its cluster name (a backend: ``postgres: <scope>: ...``)."""
        marks = (str(self.root).encode(), f"postgres: {self.scope}:".encode())
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError, ValueError):
                text = cmdline.read_bytes()
                if any(mark in text for mark in marks):
                    found.append(int(cmdline.parent.name))
        return [p for p in found if p != os.getpid()]

    def _stop_member(self, m: Member) -> None:
        for pid in m.server_pids():  # a frozen node is thawed first, so it can die
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if m.process is not None:
            with contextlib.suppress(ProcessLookupError):
                m.process.send_signal(signal.SIGCONT)
                m.process.kill()
            m.process.wait()
            m.process = None
        for pid in m.server_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _start_etcd(self) -> None:
        client, peer = (f"http://127.0.0.1:{self.etcd_port}",
                        f"http://127.0.0.1:{self.etcd_peer}")
        log = open(self.root / "etcd.log", "ab")  # noqa: SIM115 - the child's for its life
        self.etcd = subprocess.Popen(
            [str(self.etcd_binary), "--name", "local", "--data-dir", str(self.root / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"local={peer}", "--unsafe-no-fsync",
             "--log-level", "warn"], stdout=log, stderr=log, start_new_session=True)
        log.close()

        def ready() -> bool:
            with contextlib.suppress(OSError, ValueError):
                return bool(_rest(f"{client}/health").get("health") == "true")
            return False

        self.wait_until(ready, 30, "etcd did not become healthy")

    def _write_config(self, m: Member) -> None:
        import yaml

        dcs: dict[str, Any] = {
            "ttl": self.ttl, "loop_wait": self.loop_wait, "retry_timeout": self.retry_timeout,
            "maximum_lag_on_failover": 64 * 1024 * 1024,
            "postgresql": {"use_pg_rewind": True, "use_slots": True,
                           "parameters": dict(self.settings)},
        }
        if self.synchronous:
            dcs.update(synchronous_mode=True, synchronous_mode_strict=True,
                       synchronous_node_count=1)
        config = {
            "scope": self.scope, "namespace": "/jobfence/", "name": m.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{m.rest_port}",
                        "connect_address": f"127.0.0.1:{m.rest_port}"},
            "etcd3": {"hosts": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {"dcs": dcs, "initdb": [{"encoding": "UTF8"}, {"locale": "C"}]},
            "postgresql": {
                "listen": f"127.0.0.1:{m.pg_port}",
                "connect_address": f"127.0.0.1:{m.pg_port}",
                "data_dir": str(m.data), "bin_dir": str(self.bindir),
                "pgpass": str(m.root / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres", "password": "postgres"}},
                "parameters": {"unix_socket_directories": str(m.root)},
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
            },
            "tags": {"nofailover": False, "noloadbalance": False},
        }
        path = m.root / "patroni.yml"
        path.write_text(yaml.safe_dump(config))
        if self._run_as:
            os.chown(path, self._run_as["user"], self._run_as["group"])

    def start_member(self, m: Member) -> None:
        """Start (or restart, after a kill) one member's Patroni; it starts its server."""
        log = open(m.log, "ab")  # noqa: SIM115 - the child's for its life
        m.process = subprocess.Popen(
            [*self._command, str(m.root / "patroni.yml")], cwd=m.root, env=self._env,
            stdout=log, stderr=log, start_new_session=True, **self._run_as)
        log.close()

    # -- state ----------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (``GET /cluster`` of the first member that
        answers): one dict per member with ``name``, ``role``, ``state``, ``lag``..."""
        for m in self.members:
            with contextlib.suppress(OSError, ValueError):
                found: list[dict[str, Any]] = _rest(
                    f"http://127.0.0.1:{m.rest_port}/cluster").get("members", [])
                return found
        return []

    def leader(self) -> Member | None:
        """The member that is leader and runs a writable server."""
        for row in self.status():
            if row.get("role") == "leader" and row.get("state") == "running":
                return self.member(row["name"])
        return None

    def healthy(self) -> bool:
        """A leader, every other member streaming from it, and (synchronous mode) one of
        them its synchronous standby."""
        rows = self.status()
        if len(rows) != len(self.members):
            return False
        leaders = [r for r in rows if r.get("role") == "leader" and r.get("state") == "running"]
        standbys = [r for r in rows if r.get("role") in ("replica", "sync_standby")]
        if len(leaders) != 1 or not all(r.get("state") == "streaming" for r in standbys):
            return False
        return not self.synchronous or any(r.get("role") == "sync_standby" for r in rows)

    def wait_healthy(self, timeout: float = 120) -> None:
        self.wait_until(self.healthy, timeout, "the cluster did not become healthy")

    def wait_until(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.3)
        raise PatroniError(f"{what} within {timeout:g} s: {self.status()}\n{self._tails()}")

    def _tails(self) -> str:
        parts = []
        for m in self.members:
            with contextlib.suppress(OSError):
                parts.append(f"--- {m.name}\n{m.log.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    # -- faults ---------------------------------------------------------------------------

    def kill(self, m: Member) -> None:
        """Node loss: SIGKILL to the member's Patroni and its postmaster at once (the
        backends then exit on their own). ``start_member`` brings it back as a replica."""
        pids = [m.process.pid] if m.process is not None else []
        pids += m.server_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if m.process is not None:
            m.process.wait()
            m.process = None

    def freeze(self, m: Member) -> None:
        """A zombie node: its Patroni and every process of its server stopped (SIGSTOP)
        where they are, sockets open, until ``thaw``."""
        for pid in [*([m.process.pid] if m.process else []), *m.server_pids()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self, m: Member) -> None:
        for pid in [*([m.process.pid] if m.process else []), *m.server_pids()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def switchover(self, candidate: str | None = None) -> None:
        """A planned switchover to ``candidate`` (any healthy standby when None), through
        the leader's REST API as ``patronictl switchover`` does it."""
        leader = self.leader()
        if leader is None:
            raise PatroniError("no leader to switch over from")
        body: dict[str, str] = {"leader": leader.name}
        if candidate:
            body["candidate"] = candidate
        _rest(f"http://127.0.0.1:{leader.rest_port}/switchover", body, timeout=60)

    def failover(self, candidate: str | None = None) -> None:
        """An operator's failover to ``candidate`` (the first healthy standby when None),
        as ``patronictl failover --candidate NAME --force`` asks for it: Patroni's REST
        ``/failover``, which names no leader and promotes the candidate at once."""
        leader = self.leader()
        if leader is None:
            raise PatroniError("no leader to fail over from")
        name = candidate or next(m.name for m in self.members if m is not leader)
        _rest(f"http://127.0.0.1:{leader.rest_port}/failover", {"candidate": name},
              timeout=60)
