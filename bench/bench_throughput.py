"""No-op jobs per second (enqueue, claim, finish) with 1, 2 and 4 worker processes, beside
`pgbench -N` (simple-update transactions: the server's physical limit for short writes) and
the peers — procrastinate and pgqueuer, default batched and batch 1 — doing the same work
with the same number of processes on the same server.

The server is durable (fsync and synchronous_commit on, as in production): a job queue
that commits to a server that may lose the commit promises nothing. Each system's rate is
jobs / (last job's end - first job's start) over all its workers; jobfence's comes from the
database (claims to terminal writes) and every job is checked to have succeeded on its first
and only claim, individually fenced.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

from bench.common import JOBFENCE, REPO, Bench, Section, create_database, shipped_log_settings
from devtools.embedded_pg import EmbeddedPostgres
from devtools.sqlconn import connect

PROCESSES = (1, 2, 4)


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


def jobfence(bench: Bench, pg: EmbeddedPostgres, procs: int, jobs: int, *,
             quiet: bool = False) -> float:
    """Jobs per second at the shipped log settings (a line per job at info), or with the
    level raised to warning (`quiet`)."""
    dsn = create_database(pg, f"jobfence_{procs}_{'quiet' if quiet else 'shipped'}")
    env = bench.env(dsn, **shipped_log_settings()) if quiet else bench.deployed_env(dsn)
    spec = [{"actions": [{"name": "sleep", "params": {"seconds": 0}}]}] * jobs
    subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(spec), env=env,
                   cwd=REPO, capture_output=True, text=True, check=True)
    workers = [subprocess.Popen([*JOBFENCE, "worker", "--max-jobs", str(jobs)], env=env,
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(procs)]
    for w in workers:
        w.wait()
    with connect(dsn) as conn:
        row = conn.execute("""
            SELECT count(*) FILTER (WHERE status = 'succeeded' AND attempt_count = 1) AS ok,
                   count(DISTINCT attempt_id) AS fences,
                   extract(epoch FROM max(finished_at) - min(started_at))::float8 AS span
            FROM jobs""").fetchone()
    assert row is not None and row["ok"] == jobs == row["fences"], row
    return jobs / float(row["span"])


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


def run(bench: Bench) -> Section:
    jobs = 1500 if bench.quick else 8000
    seconds = 3 if bench.quick else 10
    with_peers = peers_installed()
    header = ["processes", "pgbench -N tps", "jobfence jobs/s", "vs pgbench",
              "at log level warning"]
    if with_peers:
        header += ["procrastinate", "pgqueuer (batch 10)", "pgqueuer (batch 1)",
                   "jobfence vs pgqueuer 10"]
    s = Section("Throughput of no-op jobs (durable server)",
                "python -m bench.run --only throughput", header)
    with EmbeddedPostgres(durable=True) as pg:
        create_database(pg, "pgbench", migrated=False)
        subprocess.run([str(pg.bindir / "pgbench"), "-i", "-s", "10", "-q", "pgbench"],
                       env={"PGHOST": "127.0.0.1", "PGPORT": str(pg.port),
                            "PGUSER": "postgres", "PATH": "/usr/bin:/bin"},
                       capture_output=True, check=True)
        for n in PROCESSES:
            tps = pgbench(pg, n, seconds)
            ours = jobfence(bench, pg, n, jobs)
            quiet = jobfence(bench, pg, n, jobs, quiet=True)
            row: list[Any] = [n, f"{tps:,.0f}", f"{ours:,.0f}", f"{ours / tps:.2f}×",
                              f"{quiet:,.0f} ({quiet / tps:.2f}×)"]
            if with_peers:
                pr = peer(pg, "procrastinate", 1, n, jobs)
                pq10 = peer(pg, "pgqueuer", 10, n, jobs)
                pq1 = peer(pg, "pgqueuer", 1, n, jobs)
                row += [f"{pr:,.0f} ({pr / tps:.2f}×)", f"{pq10:,.0f} ({pq10 / tps:.2f}×)",
                        f"{pq1:,.0f} ({pq1 / tps:.2f}×)", f"{ours / pq10:.2f}×"]
            s.rows.append(row)
    s.notes.append(f"{jobs:,} jobs per run; pgbench for {seconds} s per client count. "
                   "Target: jobfence ≥ 0.4 × pgbench with 2 processes, at the shipped "
                   "settings: JSON logs at level info, one `job_succeeded` line per job "
                   "(the claim and each action log at debug). The last column raises the "
                   "level to warning, to show what that line costs.")
    s.notes.append("Each jobfence job is claimed on its own (`FOR UPDATE SKIP LOCKED`, a "
                   "fresh `attempt_id`) and finished by a fenced write; a worker running "
                   "many jobs claims the next one in the same transaction as the last one's "
                   "terminal write, so a job costs one commit. pgqueuer's default mode "
                   "dequeues and acknowledges 10 jobs per round trip.")
    s.notes.append("What limits jobfence here is CPU on two cores shared by the workers and "
                   "the server: a job costs its worker about 0.4 ms of CPU (getrusage over a "
                   "4,000-job run; psycopg's send and wait, the claim's and terminal write's "
                   "results) and the server about as much again (the claim, the fenced "
                   "terminal write, its audit events, the commit), so four processes are no "
                   "faster than two. The worker's heartbeat and watchdog threads live for the "
                   "process and guard one attempt after another; starting two threads per "
                   "job had cost 0.2 ms of CPU and a quarter of the rate. pgqueuer's batched "
                   "mode amortises its round trips and commits over 10 jobs, acknowledged "
                   "together; jobfence keeps one claim, one fresh fence and one fenced "
                   "terminal write per job.")
    if not with_peers:
        s.notes.append("procrastinate and pgqueuer are not installed in this environment "
                       "(`make bench` installs them into .venv-bench).")
    return s
