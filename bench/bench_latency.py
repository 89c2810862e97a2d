"""Latency from `run_at` to start, p50 and p99, at a steady arrival rate of half the
measured throughput, for workers running one job at a time and ten at once.

The rate is measured first (2 worker processes, the same concurrency, no-op jobs). Then
jobs are enqueued with `run_at` spaced evenly at half that rate over the run, and 2 worker
processes, started first, keep looking for ready work (`--idle-seconds`) while they arrive:
what a user of a draining pool sees between a job becoming due and its action starting. A job's start is
its first claim (`started_at`); its lateness is `started_at - run_at`.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from typing import Any

from bench.bench_throughput import jobfence
from bench.common import JOBFENCE, REPO, Bench, Section, create_database
from devtools.embedded_pg import EmbeddedPostgres
from devtools.sqlconn import connect

PROCESSES = 2
CONCURRENCY = (1, 10)
FIXED_RATE = 300.0
"""Also measured at this rate, the same on every machine (the issue's figure)."""


def lateness(bench: Bench, pg: EmbeddedPostgres, rate: float, seconds: float,
             concurrency: int) -> tuple[float, float, int]:
    """p50 and p99 of run_at → start, in ms, and the jobs run."""
    dsn = create_database(pg, f"latency_{concurrency}")
    env = bench.deployed_env(dsn)
    jobs = max(1, int(rate * seconds))
    # The workers first, looking for work: a job's lateness is the worker's, not its start.
    workers = [subprocess.Popen([*JOBFENCE, "worker", "--max-jobs", str(jobs),
                                 "--concurrency", str(concurrency), "--idle-seconds", "8"],
                                env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
               for _ in range(PROCESSES)]
    with connect(dsn) as conn:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            up = conn.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE "
                              "application_name = 'jobfence-worker' AND datname = "
                              "current_database()").fetchone()
            if up is not None and up["n"] >= PROCESSES:
                break
            time.sleep(0.05)
    start = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    spec = [{"actions": [{"name": "sleep", "params": {"seconds": 0}}],
             "run_at": (start + dt.timedelta(seconds=i / rate)).isoformat()}
            for i in range(jobs)]
    subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(spec), env=env,
                   cwd=REPO, capture_output=True, text=True, check=True)
    for w in workers:
        w.wait()
    return started_after(dsn, "run_at", jobs)


LATENESS = {
    since: f"""
        SELECT count(*) FILTER (WHERE status = 'succeeded') AS ok,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY
                   extract(epoch FROM started_at - {since})) * 1000 AS p50,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY
                   extract(epoch FROM started_at - {since})) * 1000 AS p99
        FROM jobs"""
    for since in ("run_at", "created_at")}
"""p50 and p99 of a job's start after its ``run_at``, or after its enqueue."""


def started_after(dsn: str, since: str, jobs: int) -> tuple[float, float, int]:
    """p50 and p99, in ms, of the jobs' start after ``since`` (``run_at`` or
    ``created_at``), once all ``jobs`` succeeded; and how many ran."""
    with connect(dsn) as conn:
        row = conn.execute(LATENESS[since]).fetchone()
    assert row is not None and row["ok"] == jobs, row
    return float(row["p50"]), float(row["p99"]), jobs


def run(bench: Bench) -> Section:
    seconds = 5 if bench.quick else 20
    s = Section("Latency from run_at to start at half the maximum rate, and at 300/s",
                "python -m bench.run --only latency",
                ["jobs at once per worker", "max jobs/s (2 processes)", "arrival rate",
                 "jobs", "run_at → start p50", "p99"])
    with EmbeddedPostgres(durable=True) as pg:
        for c in CONCURRENCY:
            top = jobfence(bench, pg, PROCESSES, 1500 if bench.quick else 4000, c).rate
            for rate in (top / 2, FIXED_RATE):  # half the maximum moves with the machine
                p50, p99, n = lateness(bench, pg, rate, seconds, c)
                row: list[Any] = [c, f"{top:,.0f}", f"{rate:,.0f}/s", f"{n:,}",
                                  f"{p50:.1f} ms", f"{p99:.1f} ms"]
                s.rows.append(row)
    s.notes.append(f"{PROCESSES} worker processes, a durable server, jobs due evenly over "
                   f"{seconds} s. An idle worker looks for ready work every 20 ms "
                   "(`--idle-seconds`); a worker with jobs in hand takes the next one in the "
                   "same transaction as a terminal write, and its free slots look again "
                   "every quarter second, or at once when a terminal write's claim found "
                   "work — or when the queue's next job is due: free slots that find "
                   "nothing ask when that is (`worker_next_due`, one index walk) and look "
                   "again then. The enqueue of a job due later notifies a listening worker "
                   "too (`<schema>.ready`: the next section), which then asks. Before "
                   "`worker_next_due` (2026-11-25, the same figures otherwise): p50 4.5 / "
                   "7.1 ms, p99 157.7 / 312.8 ms at ×1 / ×10. A pool scaled by KEDA adds its "
                   "polling interval and a pod's start to the first job of a burst.")
    return s
