"""Bulk retry of 10,000 and 100,000 failed jobs: `jobfence retry --status failed --yes` as a
subprocess (a batch of 500 per transaction, each job audited), its rate and its longest
transaction sampled from pg_stat_activity. The reference is a bare loop of the same batches
(`UPDATE ... SET status = 'pending'` 500 rows a transaction, no rule checked) over an
identical fill.
"""

from __future__ import annotations

import json
import time

from bench.bench_retention import XactSampler
from bench.common import JOBFENCE, Bench, Section, peak_rss_mb
from devtools import sqlconn

FILL = """INSERT INTO jobs (job_id, status, actions, max_attempts, attempt_count, created_at,
                           started_at, finished_at, error)
SELECT gen_random_uuid(), 'failed', '[{"name": "sleep", "params": {"seconds": 0}}]', 3, 3,
       now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour', 'boom'
FROM generate_series(1, %(n)s)"""
BARE = """UPDATE jobs SET status = 'pending', attempt_count = 0, finished_at = NULL,
    error = NULL, visible_at = now(), reason = 'bare'
WHERE job_id IN (SELECT job_id FROM jobs WHERE status = 'failed' LIMIT 500)"""


def fill(dsn: str, n: int) -> None:
    with sqlconn.connect(dsn) as conn:
        conn.execute(FILL, {"n": n})
        conn.execute("ANALYZE jobs")


def run(bench: Bench) -> Section:
    sizes = [1_000, 10_000] if bench.quick else [10_000, 100_000]
    s = Section("Bulk retry (rate, longest transaction)", "python -m bench.run --only bulk",
                ["failed jobs", "time", "jobs/s", "vs a bare batched UPDATE loop",
                 "longest transaction (sampled)", "bare loop's longest", "peak RSS"])
    for n in sizes:
        ref = bench.database()
        fill(ref, n)
        started, longest = time.perf_counter(), 0.0
        with sqlconn.connect(ref) as conn:
            while True:
                t0 = time.perf_counter()
                done = conn.execute(BARE).rowcount
                longest = max(longest, time.perf_counter() - t0)
                if done < 500:
                    break
        ref_secs = time.perf_counter() - started
        dsn = bench.database()
        fill(dsn, n)
        with XactSampler(dsn, "jobfence-retry") as sampler:
            code, secs, mb, out, err = peak_rss_mb(
                [*JOBFENCE, "retry", "--status", "failed", "--yes", "-o", "json"],
                bench.env(dsn, JOBFENCE_BATCH_SIZE="500"))
        if code != 0:
            raise RuntimeError(f"retry failed: {err.decode()[-2000:]}")
        report = json.loads(out)
        if report["retried"] != n:
            raise RuntimeError(f"expected {n} retried: {report}")
        s.rows.append([f"{n:,}", f"{secs:.2f} s", f"{n / secs:,.0f}",
                       f"{(n / secs) / (n / ref_secs):.2f}× ({n / ref_secs:,.0f}/s)",
                       f"{sampler.longest * 1000:.0f} ms", f"{longest * 1000:.0f} ms",
                       f"{mb:.0f} MB"])
    s.notes += [
        "The command's time includes its start-up and the count it makes first (to ask past "
        "`--limit`). Each batch is one statement of `operator_retry_many`, which locks its "
        "rows in id order and checks every rule of `retry` job by job (drain, parent, "
        "stopping, a child's parent, the resource); the audit trigger writes one event per "
        "job.",
    ]
    return s
