"""Latency from an enqueue to the job's start, p50 and p99, for jobs arriving one by one
(each its own transaction, 300 a second) while two worker processes wait for work: with
the workers listening for ready work (``<schema>.ready``), and polling only, as a worker
behind a transaction pooler does. One job at a time per worker and ten at once."""

from __future__ import annotations

import subprocess
import time

from bench.bench_latency import CONCURRENCY, PROCESSES, started_after
from bench.common import JOBFENCE, REPO, Bench, Section, create_database
from devtools.embedded_pg import EmbeddedPostgres
from devtools.sqlconn import connect
from jobfence.ids import uuid7
from jobfence.store import Store
from jobfence.store.types import NewJob

ARRIVALS_PER_SECOND = 300


def arrivals(bench: Bench, pg: EmbeddedPostgres, seconds: float, concurrency: int,
             listening: bool) -> tuple[float, float, int]:
    """p50 and p99 of enqueue → start, in ms, for jobs enqueued one by one (each its own
    transaction) at ``ARRIVALS_PER_SECOND``, and the jobs run."""
    dsn = create_database(pg, f"arrivals_{concurrency}_{int(listening)}")
    env = bench.deployed_env(dsn)
    if not listening:  # what a worker behind PgBouncer in transaction mode does: it polls
        env["JOBFENCE_DATABASE_POOLER"] = "transaction"
    jobs = int(ARRIVALS_PER_SECOND * seconds)
    workers = [subprocess.Popen([*JOBFENCE, "worker", "--max-jobs", str(jobs),
                                 "--concurrency", str(concurrency), "--idle-seconds", "3"],
                                env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
               for _ in range(PROCESSES)]
    with connect(dsn) as conn:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            up = conn.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE "
                              "application_name = 'jobfence-wakeup' AND datname = "
                              "current_database()").fetchone() if listening else None
            if not listening or (up is not None and up["n"] >= PROCESSES):
                break
            time.sleep(0.05)
        time.sleep(1.0)  # every worker idle, looking
        store = Store(conn)
        began = time.monotonic()
        for i in range(jobs):
            pause = began + i / ARRIVALS_PER_SECOND - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            store.jobs.enqueue([NewJob(job_id=uuid7(), max_attempts=1, actions=[
                {"name": "sleep", "params": {"seconds": 0}}])])
    for w in workers:
        w.wait()
    return started_after(dsn, "created_at", jobs)


def run(bench: Bench) -> Section:
    seconds = 3 if bench.quick else 10
    s = Section(f"Latency from an enqueue to the start, jobs arriving one by one "
                f"({ARRIVALS_PER_SECOND}/s)",
                "python -m bench.run --only arrivals",
                ["jobs at once per worker", "workers", "jobs", "enqueue → start p50",
                 "p99"])
    with EmbeddedPostgres(durable=True) as pg:
        for c in CONCURRENCY:
            for listening in (True, False):
                p50, p99, n = arrivals(bench, pg, seconds, c, listening)
                s.rows.append([c, "listening" if listening else "polling (pooler: "
                               "transaction)", f"{n:,}", f"{p50:.1f} ms", f"{p99:.1f} ms"])
    s.notes.append(f"{PROCESSES} worker processes waiting for work (`--idle-seconds`), a "
                   "durable server; each job enqueued in its own transaction, evenly over "
                   f"{seconds} s. Listening: each commit notifies `<schema>.ready` and a "
                   "waiting worker looks at once. Polling: an idle worker looks every 20 ms, "
                   "free slots beside running jobs every quarter second.")
    return s
