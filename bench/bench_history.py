"""Cost against history: the KEDA query, a claim and a sweeper pass with 10k vs 1M finished
jobs in the table (the same small live workload in both). Partial indexes keep all three
index scans over the live rows, so the ratio should be near 1 (target ≤ 1.2×)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from bench.common import Bench, Section
from functions import sweeper
from shared.db import Connection, connect
from shared.queries import QUERIES
from shared.runner import Deps
from shared.settings import Settings
from shared.store import FencedStore

PENDING = 500
EXPIRED = 100


def fill(conn: Connection, finished: int) -> None:
    conn.execute("""
        INSERT INTO jobs (job_id, status, actions, max_attempts, attempt_count, attempt_id,
                          started_at, finished_at, created_at)
        SELECT gen_random_uuid(), (ARRAY['succeeded', 'failed', 'cancelled'])[1 + i %% 3],
               '[{"name": "sleep", "params": {"seconds": 0}}]', 3, 1, gen_random_uuid(),
               now() - interval '2 days', now() - interval '1 day', now() - interval '2 days'
        FROM generate_series(1, %s) AS i""", (finished,))
    conn.execute("""
        INSERT INTO jobs (job_id, status, actions, max_attempts)
        SELECT gen_random_uuid(), 'pending', '[]', 3 FROM generate_series(1, %s)""",
                 (PENDING,))
    conn.execute("VACUUM ANALYZE jobs")


def expire_some(conn: Connection) -> None:
    """EXPIRED running jobs whose lease ran out (what the sweeper pass finds)."""
    conn.execute("""
        WITH pick AS (SELECT job_id FROM jobs WHERE status = 'pending' LIMIT %s)
        UPDATE jobs j SET status = 'running', attempt_id = gen_random_uuid(),
            attempt_count = 1, claimed_by = 'gone', claimed_at = now() - interval '1 hour',
            visible_at = now() - interval '1 minute'
        FROM pick WHERE j.job_id = pick.job_id""", (EXPIRED,))


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure(dsn: str, repeat: int) -> dict[str, float]:
    conn = connect(dsn)
    store = FencedStore(conn)
    settings = Settings(database_url=dsn, retry_base_seconds=0)
    try:
        keda = timed(lambda: conn.execute(QUERIES["queue_keda_count"]).fetchone(), repeat * 5)

        def claim_rolled_back() -> None:
            with conn.transaction(force_rollback=True):
                store.claim(worker_id="bench", lease_seconds=60)

        claim = timed(claim_rolled_back, repeat * 5)
        passes = []
        for _ in range(repeat):
            expire_some(conn)
            passes.append(timed(lambda: sweeper.run_once(settings, Deps(store, settings)), 1))
            conn.execute("UPDATE jobs SET status = 'pending', attempt_count = 0, "
                         "visible_at = now(), finished_at = NULL, retain_until = NULL, "
                         "error = NULL WHERE status IN ('pending', 'failed') "
                         "AND claimed_by IS NULL AND finished_at IS NULL")
        return {"keda": keda, "claim": claim, "sweeper": statistics.median(passes)}
    finally:
        conn.close()


def run(bench: Bench) -> Section:
    small, big = (10_000, 200_000) if bench.quick else (10_000, 1_000_000)
    repeat = 5 if bench.quick else 15
    results = {}
    for n in (small, big):
        dsn = bench.database()
        with connect(dsn) as conn:
            fill(conn, n)
        results[n] = measure(dsn, repeat)
    s = Section(f"Cost against history: {small:,} vs {big:,} finished jobs",
                "python -m bench.run --only history",
                ["operation", f"{small:,} finished", f"{big:,} finished", "ratio",
                 "target"])
    names = {"keda": "KEDA query (ScaledJob trigger)", "claim": "claim one job",
             "sweeper": f"sweeper pass ({EXPIRED} expired leases)"}
    for key, label in names.items():
        a, b = results[small][key], results[big][key]
        s.rows.append([label, f"{a * 1000:.2f} ms", f"{b * 1000:.2f} ms", f"{b / a:.2f}×",
                       "≤ 1.2×"])
    s.notes.append(f"Medians; {PENDING} pending jobs in both tables. The claim runs in a "
                   "rolled-back transaction so every measurement sees the same queue.")
    return s
