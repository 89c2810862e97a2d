"""No-op jobs per second (enqueue, claim, finish) with 1, 2 and 4 worker processes, each
running one job at a time or ten at once, beside
`pgbench -N` (simple-update transactions: the server's physical limit for short writes) and
the peers — procrastinate and pgqueuer, default batched and batch 1 — doing the same work
with the same number of processes on the same server.

The server is durable (fsync and synchronous_commit on, as in production): a job queue
that commits to a server that may lose the commit promises nothing. Each system's rate is
jobs / (last job's end - first job's start) over all its workers; jobfence's comes from the
database (claims to terminal writes) and every job is checked to have succeeded on its first
and only claim, individually fenced.

The default pool runs one job per process (``jobfence worker`` as its manifest starts it:
one claim, then exit): its column starts a fresh process per job, as KEDA starts a pod
per job, in as many lanes as processes. Each figure is the median of alternated rounds (each
round measures pgbench, then every jobfence configuration, in turn), so that a disturbance
of the shared machine hits all of them alike. ``--against PYTHON`` measures an earlier
checkout's jobfence in the same rounds, alternated with this one: before and after.
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import JOBFENCE, REPO, Bench, Section, create_database
from devtools.embedded_pg import EmbeddedPostgres
from devtools.sqlconn import connect

PROCESSES = (1, 2, 4)
CONCURRENCY = (1, 10)


def pgbench(pg: EmbeddedPostgres, clients: int, seconds: int) -> float:
    binary = str(pg.bindir / "pgbench")
    env = {"PGHOST": "127.0.0.1", "PGPORT": str(pg.port), "PGUSER": "postgres",
           "PATH": "/usr/bin:/bin"}
    r = subprocess.run([binary, "-N", "-c", str(clients), "-j", str(clients), "-T",
                        str(seconds), "pgbench"], env=env, capture_output=True, text=True,
                       check=True)
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", r.stdout)
    if not m:
        raise RuntimeError(f"pgbench printed no tps: {r.stdout[-500:]}")
    return float(m.group(1))


def server_cpu_seconds(pg: EmbeddedPostgres) -> float:
    """CPU the server has used so far: the postmaster and the backends it has reaped
    (cutime, cstime), plus the live ones."""
    tick = os.sysconf("SC_CLK_TCK")
    pm = int((pg.data / "postmaster.pid").read_text().split()[0])

    def fields(pid: int) -> list[str]:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rfind(")") + 2:].split()

    total = sum(int(x) for x in fields(pm)[11:15])  # utime stime cutime cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                f = fields(int(entry.name))
            except OSError:
                continue
            if int(f[1]) == pm:
                total += int(f[11]) + int(f[12])
    return total / tick


class Run(NamedTuple):
    rate: float
    worker_ms: float
    """CPU per job in the worker processes, in ms."""
    server_ms: float
    """CPU per job in the server, in ms."""


def jobfence(bench: Bench, pg: EmbeddedPostgres, procs: int, jobs: int,
             concurrency: int | None = 1, command: Sequence[str] = JOBFENCE) -> Run:
    """Jobs per second at the shipped log settings (a line per job at info), and the CPU
    each job cost the workers and the server. ``concurrency`` None: one job per process
    (the default pool), ``procs`` lanes each starting a fresh worker per job."""
    dsn, env = bench.noop_jobs(pg, f"jobfence_{procs}_{concurrency or 0}", jobs, command)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server = server_cpu_seconds(pg)
    if concurrency is None:
        def lane(n: int) -> None:
            for _ in range(n):  # as a pod of the default pool: one claim, then exit
                subprocess.run([*command, "worker"], env=env, cwd=REPO, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        lanes = [threading.Thread(target=lane, args=(jobs // procs + (i < jobs % procs),))
                 for i in range(procs)]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()
    else:
        workers = [subprocess.Popen([*command, "worker", "--max-jobs", str(jobs),
                                     "--concurrency", str(concurrency)], env=env,
                                    cwd=REPO, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
                   for _ in range(procs)]
        for w in workers:
            w.wait()
    time.sleep(0.3)  # the backends of the workers' connections end and are reaped
    server = server_cpu_seconds(pg) - server
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    with connect(dsn) as conn:
        row = conn.execute("""
            SELECT count(*) FILTER (WHERE status = 'succeeded' AND attempt_count = 1) AS ok,
                   count(DISTINCT attempt_id) AS fences,
                   extract(epoch FROM max(finished_at) - min(started_at))::float8 AS span
            FROM jobs""").fetchone()
    assert row is not None and row["ok"] == jobs == row["fences"], row
    return Run(jobs / float(row["span"]), worker / jobs * 1000, server / jobs * 1000)


def peers_installed() -> bool:
    return subprocess.run([sys.executable, "-c", "import procrastinate, pgqueuer"],
                          capture_output=True, check=False).returncode == 0


def peer(pg: EmbeddedPostgres, system: str, batch: int, procs: int, jobs: int) -> float:
    dsn = create_database(pg, f"{system}_{batch}_{procs}", migrated=False)
    run: list[Any] = [sys.executable, "-m", "bench.peers", system]
    subprocess.run([*run, "setup", dsn, str(jobs)], cwd=REPO, capture_output=True,
                   text=True, check=True)
    workers = [subprocess.Popen([*run, "work", dsn, str(batch)], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
               for _ in range(procs)]
    results = [json.loads(w.communicate()[0].strip().splitlines()[-1]) for w in workers]
    done = sum(r["n"] for r in results)
    assert done == jobs, (system, done, jobs)
    span = max(r["last"] for r in results if r["last"]) - min(
        r["first"] for r in results if r["first"])
    return jobs / span


def median_run(runs: Sequence[Run]) -> Run:
    return Run(*(statistics.median(getattr(r, f) for r in runs) for f in Run._fields))


MODES: dict[str, int | None] = {"per process": None, "×1": 1, "×10": 10}
"""jobfence's configurations: one job per process (the default pool: a fresh process per
job), one job at a time in a process that keeps claiming, ten at once (the draining pool's
shipped ``concurrency: 10``)."""


def run(bench: Bench) -> Section:
    jobs = 1500 if bench.quick else 8000
    per_process = 30 if bench.quick else 100
    """Jobs of the one-job-per-process runs: each costs a process start."""
    rounds = bench.rounds or (1 if bench.quick else 3)
    seconds = 3 if bench.quick else 10
    with_peers = peers_installed()
    versions = bench.versions()
    header = ["processes", "pgbench -N tps"]
    header += [f"{v}jobfence {m} jobs/s (vs pgbench)" for v in versions for m in MODES]
    if with_peers:
        header += ["procrastinate", "pgqueuer (batch 10)", "pgqueuer (batch 1)",
                   "jobfence ×10 vs pgqueuer 10"]
    header += [f"{v}CPU/job {m}: worker + server" for v in versions for m in MODES]
    s = Section("Throughput of no-op jobs (durable server)",
                "python -m bench.run --only throughput", header)
    with EmbeddedPostgres(durable=True) as pg:
        create_database(pg, "pgbench", migrated=False)
        subprocess.run([str(pg.bindir / "pgbench"), "-i", "-s", "10", "-q", "pgbench"],
                       env={"PGHOST": "127.0.0.1", "PGPORT": str(pg.port),
                            "PGUSER": "postgres", "PATH": "/usr/bin:/bin"},
                       capture_output=True, check=True)
        for n in PROCESSES:
            tps_runs: list[float] = []
            runs: dict[tuple[str, str], list[Run]] = {(v, m): [] for v in versions
                                                      for m in MODES}
            for _ in range(rounds):  # alternated: a disturbance hits every column alike
                tps_runs.append(pgbench(pg, n, seconds))
                for v, command in versions.items():
                    for m, c in MODES.items():
                        runs[v, m].append(jobfence(bench, pg, n, per_process if c is None
                                                   else jobs, c, command))
            tps = statistics.median(tps_runs)
            ours = {k: median_run(r) for k, r in runs.items()}
            row: list[Any] = [n, f"{tps:,.0f}"]
            row += [f"{r.rate:,.0f} ({r.rate / tps:.2f}×)" for r in ours.values()]
            if with_peers:
                pr = peer(pg, "procrastinate", 1, n, jobs)
                pq10 = peer(pg, "pgqueuer", 10, n, jobs)
                pq1 = peer(pg, "pgqueuer", 1, n, jobs)
                row += [f"{pr:,.0f} ({pr / tps:.2f}×)", f"{pq10:,.0f} ({pq10 / tps:.2f}×)",
                        f"{pq1:,.0f} ({pq1 / tps:.2f}×)",
                        f"{ours[list(versions)[-1], '×10'].rate / pq10:.2f}×"]
            row += [f"{r.worker_ms:.2f} + {r.server_ms:.2f} ms" for r in ours.values()]
            s.rows.append(row)
    s.notes.append(f"{jobs:,} jobs per run ({per_process} for one job per process); pgbench "
                   f"for {seconds} s per client count; medians of {rounds} alternated "
                   "round(s). Targets: ten at once (the draining pool) ≥ 1.5 × pgbench "
                   "with 2 processes, and at least pgqueuer's batch 10; one at a time "
                   "≥ 0.5 × pgbench. Measured at the "
                   "shipped settings: JSON logs at level info, a `job_claimed` and a "
                   "`job_succeeded` line per job (each action logs at debug). Per process: "
                   "a fresh `jobfence worker` per job, as the default pool's pods run (its "
                   "rate and CPU include the process start); ×1 and ×10: each worker "
                   "process keeps claiming, one job at a time or ten at once "
                   "(`--concurrency 10`).")
    s.notes.append("Each jobfence job is claimed with a fresh `attempt_id` (`FOR UPDATE SKIP "
                   "LOCKED`) and finished by a write matched on its own job and attempt. A "
                   "worker claims for all its free slots in one statement; the terminal "
                   "writes of the jobs that finished while the last round trip was in "
                   "flight go out as one statement (`worker_finish_many`; one alone as the "
                   "single-row `worker_finish`, no JSON), with the claims of the next jobs "
                   "in the same transaction: one round trip and one commit for as many "
                   "jobs. pgqueuer's default mode dequeues and acknowledges 10 "
                   "jobs per round trip.")
    s.notes.append("CPU per job: the worker processes' user + system time (getrusage of "
                   "the benchmark's children) and the server's (the postmaster's own and "
                   "its reaped backends', from /proc), each over the run, divided by the "
                   "jobs. Both cores are shared by the workers and the server.")
    if bench.against:
        s.notes.append("*before* and *after*: two checkouts, each migrating its own "
                       "databases (its database functions are part of what it measures), "
                       "enqueuing and working with its own code, round by round on the "
                       "same server.")
    if not with_peers:
        s.notes.append("procrastinate and pgqueuer are not installed in this environment "
                       "(`make bench` installs them into .venv-bench).")
    return s
