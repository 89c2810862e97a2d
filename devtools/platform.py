"""KEDA and the CronJobs, on one machine: what the demo and the chaos run schedule jobfence
with when there is no cluster.

* **KEDA stand-in**: as it starts and then every ``poll_seconds`` (KEDA polls a
  ScaledJob as soon as its scale loop starts, then every ``pollingInterval``), for each
  pool (``jobfence.pools.Pool``, as manifests/pools.yaml declares them), it runs the pool's
  own trigger query
  (``Queues.scaler_value``, the text its ScaledJob embeds) and applies KEDA's ``default``
  scaling strategy — start ``min(maxPods, ceil(value / 1)) - running`` new workers of
  that pool — each a ``jobfence worker`` process with the pool's arguments (one job, or
  draining with its budgets), started after ``pod_start_seconds`` (a pod's scheduling,
  image pull and start-up; KEDA counts the Job from its creation) with the installation's
  identity in its environment, so its worker id is ``local:INSTALLATION:HOST:PID`` and the
  ``local`` cluster of this installation (and no other) can vouch for it. Where it
  differs from the KEDA operator (bench/bench_keda.py runs both): KEDA counts a Job as
  running until the Job controller marks it finished, this stand-in a worker until its
  process exits — a pod that never starts (an image the cluster cannot pull) or one lost
  with its node holds its slot in KEDA, not here; and KEDA's Job controller and kubelet
  start pods one by one as their Jobs appear, where this starts every process at once.
* **CronJob stand-in**: each periodic function runs as its own short-lived process on a
  compressed schedule; a run still going when the next tick comes is skipped
  (``concurrencyPolicy: Forbid``).

Logs of every process go to files under ``logs/``; the exit codes are kept for the summary.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devtools import REPO
from devtools.roles import url_of
from jobfence.db import Connection, connect
from jobfence.errors import JobfenceError
from jobfence.pools import Pool
from jobfence.store import Store

JOBFENCE = [sys.executable, "-m", "jobfence.functions.cli"]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    pool: str = ""
    started: float = field(default_factory=time.monotonic)
    exit_code: int | None = None


class LocalPlatform:
    def __init__(self, dsn: str, env: dict[str, str], logs: Path, *,
                 schedules: dict[str, float], poll_seconds: float = 0.5,
                 pools: tuple[Pool, ...] = (Pool(name="default", maxPods=8),),
                 pod_start_seconds: float = 0.0, role_urls: dict[str, str] | None = None,
                 ) -> None:
        self.dsn, self.env, self.logs = dsn, {**env, "JOBFENCE_CLUSTER": "local"}, logs
        self.role_urls = role_urls or {}
        """Each role's login URL (devtools.roles.ensure_logins): every process then
        connects as its function's role, as a pod does with its Secret."""
        self.schema = self.env.get("JOBFENCE_SCHEMA", "jobfence")
        self.installation: str | None = None
        self.schedules = schedules
        self.poll_seconds, self.pod_start_seconds = poll_seconds, pod_start_seconds
        self.pools = {p.name: p for p in pools}
        self.workers: list[Proc] = []
        self.functions: dict[str, Proc] = {}
        self.exits: Counter[str] = Counter()
        self.function_runs: Counter[str] = Counter()
        self.workers_started: Counter[str] = Counter()
        """Worker processes started, by pool."""
        self.worker_pids: set[int] = set()
        """Every worker process it ever started."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="local-platform", daemon=True)
        self._next = {name: time.monotonic() for name in schedules}
        self.on_spawn: Callable[[Proc], None] | None = None
        self.polled = threading.Event()
        """Set after each poll has scaled the pools (the first comes as the platform starts)."""
        logs.mkdir(parents=True, exist_ok=True)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> LocalPlatform:
        self.identify()
        self._thread.start()
        return self

    def identify(self) -> str:
        """The installation's identity, from its (migrated) database. Every process the
        platform starts carries it, as a pool's pods carry its label: the local cluster
        vouches for (and signals) exactly those."""
        if self.installation is None:
            conn = connect(self.url("info"), application_name="jobfence-local-platform")
            try:
                identity = Store(conn, self.schema).control.identity(
                    self.env.get("JOBFENCE_INSTALLATION"))
            finally:
                conn.close()
            assert identity.installation is not None
            self.installation = identity.installation
            self.env["JOBFENCE_INSTALLATION"] = self.installation
        return self.installation

    def url(self, command: str) -> str:
        """The URL ``command`` connects with (KEDA's query runs as the scaler role)."""
        return url_of(self.role_urls, command, self.dsn)

    def env_of(self, command: str) -> dict[str, str]:
        return {**self.env, "JOBFENCE_DATABASE_URL": self.url(command)}

    def stop(self, kill_workers: bool = True, grace: float = 30.0) -> list[Proc]:
        """Start nothing more; kill every process still running (``kill_workers``), or give
        them ``grace`` seconds to end on their own and kill the rest. The ones killed."""
        self._stop.set()
        self._thread.join(timeout=30)
        with self._lock:
            procs = [*self.workers, *self.functions.values()]
        killed: list[Proc] = []
        for p in procs:
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.send_signal(18)  # SIGCONT: a paused process must be able to die
                    if kill_workers:
                        p.popen.kill()
                        killed.append(p)
        until = time.monotonic() + grace
        for p in procs:
            try:
                p.popen.wait(timeout=max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.kill()
                killed.append(p)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(timeout=30)
        return killed

    def live_workers(self, pool: str | None = None) -> list[Proc]:
        with self._lock:
            return [w for w in self.workers if w.popen.poll() is None
                    and (pool is None or w.pool == pool)]

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        conn: Connection | None = None
        try:
            while not self._stop.is_set():
                self._reap()
                try:
                    conn = conn if conn is not None and not conn.closed else connect(
                        self.role_urls.get("scaler", self.dsn),
                        application_name="jobfence-local-keda")
                    self._scale(conn)
                except JobfenceError:  # the database may be restarting: KEDA retries too
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            conn.close()
                    conn = None
                self.polled.set()
                self._cron()
                if self._stop.wait(self.poll_seconds):
                    break
        finally:
            if conn is not None:
                conn.close()

    def _reap(self) -> None:
        """Note the exit of every process that ended since the last tick."""
        with self._lock:
            for w in self.workers:
                code = w.popen.poll()
                if code is not None and w.exit_code is None:
                    w.exit_code = code
                    self.exits[f"{w.pool} worker exit {code}"] += 1
            self.workers = [w for w in self.workers if w.exit_code is None]
            for name, p in list(self.functions.items()):
                code = p.popen.poll()
                if code is not None:
                    self.exits[f"{name} exit {code}"] += 1
                    del self.functions[name]

    def _scale(self, conn: Connection) -> None:
        queues = Store(conn, self.schema).queues
        for pool in self.pools.values():
            value = queues.scaler_value(pool.queue)
            running = len(self.live_workers(pool.name))  # a Job counts from its creation
            # targetQueryValue is the pool's concurrency (manifests/pools.yaml)
            wanted = min(pool.max_pods, math.ceil(value / pool.concurrency)) - running
            for _ in range(max(0, wanted)):
                self.spawn_worker(pool.name)

    def spawn_worker(self, pool: str = "default") -> Proc:
        """Start one worker of ``pool`` as its ScaledJob would: after the pod's start-up
        (the process waits it out, then becomes the worker: same pid)."""
        self.identify()
        self.workers_started[pool] += 1
        name = f"{pool}-worker-{self.workers_started[pool]}"
        log = self.logs / f"{name}.log"
        argv = [*JOBFENCE, *self.pools[pool].args]
        if self.pod_start_seconds > 0:
            argv = ["sh", "-c", 'sleep "$0" && exec "$@"', str(self.pod_start_seconds),
                    *argv]
        with log.open("wb") as f:
            popen = subprocess.Popen(argv, env=self.env_of("worker"), cwd=REPO, stdout=f,
                                     stderr=subprocess.STDOUT)
        proc = Proc(name, popen, log, pool)
        with self._lock:
            self.workers.append(proc)
            self.worker_pids.add(popen.pid)
        if self.on_spawn:
            self.on_spawn(proc)
        return proc

    def _cron(self) -> None:
        now = time.monotonic()
        for name, every in self.schedules.items():
            if now < self._next[name]:
                continue
            self._next[name] = now + every
            with self._lock:
                if name in self.functions:  # concurrencyPolicy: Forbid
                    self.exits[f"{name} tick skipped (Forbid)"] += 1
                    continue
                self.function_runs[name] += 1
                log = self.logs / f"{name}.log"
                with log.open("ab") as f:
                    popen = subprocess.Popen([*JOBFENCE, name], env=self.env_of(name),
                                             cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
                self.functions[name] = Proc(name, popen, log)
