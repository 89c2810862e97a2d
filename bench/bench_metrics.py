"""What the lag and duration metrics (migration 0020) cost where it matters: the worker's
path, whose every transition statement runs the audit trigger — 0020's, which also measures
a parent's finalization lag, against 0019's, swapped in and out of one database — and
reading the metrics (the overdue gauge's looks included) with 10k vs 1M finished jobs in
the table."""

from __future__ import annotations

import re
import statistics
import time
from importlib import resources

from bench.bench_history import fill
from bench.common import Bench, Section
from devtools.sqlconn import connect
from jobfence import db, metrics
from jobfence.db import Connection
from jobfence.store import Store

JOBS = 30
"""Jobs claimed and finished, one at a time, per sample of the worker's path: small
samples, many of them, alternating between the two triggers, so that the load of a shared
machine drifts over both alike."""

def audit_trigger(migration: str) -> db.Composed:
    """The audit trigger function as a migration creates it."""
    text = (resources.files("jobfence.store.schema") / migration).read_text()
    [body] = re.findall(r"CREATE OR REPLACE FUNCTION \{schema\}\.jobfence_audit_update\(\)"
                        r".*?\n\$\$;\n", text, re.DOTALL)
    return db.statement(body, schema="jobfence")  # type: ignore[arg-type]


def worker_path(conn: Connection, store: Store) -> float:
    """Jobs per second through claim → finish, one job at a time (the jobs enqueued
    beforehand, outside the sample)."""
    conn.execute("""INSERT INTO jobs (job_id, status, actions, max_attempts)
                    SELECT gen_random_uuid(), 'pending', '[]', 3
                    FROM generate_series(1, %s)""", (JOBS,))
    t0 = time.perf_counter()
    for _ in range(JOBS):
        [c] = store.attempts.claim(worker_id="bench", lease_seconds=60)
        store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True)
    took = time.perf_counter() - t0
    conn.execute("DELETE FROM jobs")
    conn.execute("DELETE FROM job_events")
    store.job_metrics.fold()
    return JOBS / took


def read_metrics(store: Store) -> float:
    t0 = time.perf_counter()
    for _ in range(5):
        metrics.exposition(store)
    return (time.perf_counter() - t0) / 5


def run(bench: Bench) -> Section:
    repeat = 5 if bench.quick else 15
    rounds = 20 if bench.quick else 80
    small, big = (10_000, 200_000) if bench.quick else (10_000, 1_000_000)
    conn = connect(bench.database())
    store = Store(conn)
    triggers = {"0019": audit_trigger("0019_hostile_logins.sql"),
                "0020": audit_trigger("0020_lag_and_pass_metrics.sql")}
    rates: dict[str, list[float]] = {k: [] for k in triggers}
    for i in range(rounds):  # alternately, each first in turn: the machine's noise and
        for name in sorted(triggers, reverse=bool(i % 2)):  # the order hit both alike
            conn.execute(triggers[name])
            worker_path(conn, store)  # the trigger's statements planned again
            rates[name].append(worker_path(conn, store))
    conn.execute(triggers["0020"])
    conn.close()
    reads: dict[int, list[float]] = {}
    probes = {}
    for n in (small, big):
        c = connect(bench.database())
        fill(c, n)
        probes[n] = (c, Store(c))
    for _ in range(repeat):
        for n, (_, s) in probes.items():
            reads.setdefault(n, []).append(read_metrics(s))
    for c, _ in probes.values():
        c.close()
    old, new = (statistics.median(rates[k]) for k in ("0019", "0020"))
    a, b = (statistics.median(reads[n]) for n in (small, big))
    s = Section("Lag and duration metrics: the worker's path, and reading them",
                "python -m bench.run --only metrics",
                ["what", "reference", "with 0020", "ratio", "target"])
    s.rows.append([f"claim + finish, one job at a time ({rounds} samples of {JOBS})",
                   f"{old:,.0f} jobs/s (0019's audit trigger)", f"{new:,.0f} jobs/s",
                   f"{new / old:.2f}×", "no visible cost (≈ 1.0×)"])
    s.rows.append(["`jobfence metrics` read (exposition, overdue gauge included)",
                   f"{a * 1000:.1f} ms ({small:,} finished)",
                   f"{b * 1000:.1f} ms ({big:,} finished)", f"{b / a:.2f}×", "≤ 1.2×"])
    s.notes.append(f"Medians of the samples, the two sides alternately ({repeat} samples of 5 "
                   "reads for the metrics). The worker's path runs on one connection against "
                   "a server with fsync off; the trigger is swapped between samples (a "
                   "sample after each swap is thrown away: its statements are planned "
                   "again). The only change on the path is the trigger's `CASE` that looks "
                   "up a parent's last child when a parent is finalized. (Two databases, "
                   "one with each trigger, measured 0.90× three times in a row, while the "
                   "same triggers swapped in one database did not differ beyond the noise: "
                   "the comparison is made in one.)")
    return s
