"""What the supported replication costs: no-op jobs per second (two ``jobfence worker``
processes, ten jobs at once each, as the draining pool runs) and ``pgbench -N -c 2`` on
one durable server, and on a durable Patroni cluster of three members (etcd, as in the
failover tests) with a synchronous standby required (``synchronous_mode_strict``: every
commit waits for the standby's flush) and with Patroni's default asynchronous replication.

On this machine the three members share its two cores with the workers: the standbys'
WAL replay is part of the cost measured, which a cluster of three machines would not pay.
Every job is checked to have succeeded on its first and only claim.
"""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench.bench_throughput import jobfence, pgbench
from bench.common import Bench, Section, create_database
from devtools.embedded_pg import EmbeddedPostgres, find_bindir
from devtools.patroni import PatroniCluster

JOBS = 3000
PROCESSES = 2
CONCURRENCY = 10


class Primary:
    """A Patroni cluster's writer as the throughput bench's functions address a server:
    the multi-host URL kept to the writer, the leader's port and data directory."""

    def __init__(self, cluster: PatroniCluster) -> None:
        leader = cluster.leader()
        assert leader is not None, "no leader"
        self.cluster = cluster
        self.bindir = find_bindir()
        self.port = leader.pg_port
        self.data: Path = leader.data

    @property
    def dsn(self) -> str:
        return self.cluster.dsn

    def url(self, dbname: str) -> str:
        return self.cluster.url(dbname)


def measure(bench: Bench, pg: Any, rounds: int, seconds: int) -> tuple[float, float, float]:
    """pgbench tps, jobfence jobs/s, and CPU per job (worker + server, ms): medians."""
    create_database(pg, "pgbench", migrated=False)
    subprocess.run([str(pg.bindir / "pgbench"), "-i", "-s", "10", "-q", "pgbench"],
                   env={"PGHOST": "127.0.0.1", "PGPORT": str(pg.port), "PGUSER": "postgres",
                        "PATH": "/usr/bin:/bin"}, capture_output=True, check=True)
    tps, rate, cpu = [], [], []
    for _ in range(rounds):
        tps.append(pgbench(pg, PROCESSES, seconds))
        run = jobfence(bench, pg, PROCESSES, JOBS // (2 if bench.quick else 1), CONCURRENCY)
        rate.append(run.rate)
        cpu.append(run.worker_ms + run.server_ms)
    return statistics.median(tps), statistics.median(rate), statistics.median(cpu)


def run(bench: Bench) -> Section:
    rounds = bench.rounds or (1 if bench.quick else 2)
    seconds = 3 if bench.quick else 10
    s = Section("What a synchronous standby costs", "python -m bench.run --only replication",
                ["server", "pgbench -N -c 2 tps", f"jobfence jobs/s ({PROCESSES} workers "
                 f"×{CONCURRENCY})", "vs one server", "CPU/job worker + server (primary)"])
    found: dict[str, tuple[float, float, float]] = {}
    with EmbeddedPostgres(durable=True) as pg:
        found["one server"] = measure(bench, pg, rounds, seconds)
    for name, synchronous in (("Patroni, synchronous standby required", True),
                              ("Patroni, asynchronous (its default)", False)):
        with PatroniCluster(synchronous=synchronous, settings={"fsync": "on"}) as cluster:
            found[name] = measure(bench, Primary(cluster), rounds, seconds)
    base = found["one server"][1]
    for name, (tps, rate, cpu) in found.items():
        s.rows.append([name, f"{tps:,.0f}", f"{rate:,.0f}", f"{rate / base:.2f}×",
                       f"{cpu:.2f} ms"])
    s.notes.append(
        f"{JOBS:,} no-op jobs per measurement, median of {rounds} alternated with pgbench; "
        "every server durable (fsync on, synchronous_commit on). The three members run on "
        "the same two cores as the workers, so the standbys' replay is paid here too.")
    return s
