"""Enqueue from one spec list (`jobfence enqueue --spec -`), the list read as a stream: every
spec validated, the jobs written in batches in one transaction with their audit events.
Target ≥ 30k jobs/s for 100k jobs (pgqueuer's bulk rate), peak memory flat (< 150 MB at 10k
and at 100k); the process's start-up is included, and reported apart. pgqueuer's own bulk
enqueue (its `Queries.enqueue`, 1,000 a call, nothing validated) is measured beside it on
the same server."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.bench_throughput import peers_installed
from bench.common import JOBFENCE, Bench, Section, create_database, peak_rss_mb
from devtools import REPO


def spec_list(n: int) -> bytes:
    """``n`` distinct specs, as a list a user makes: params and a label of their own each
    (nothing a cache of repeated specs could skip), three attempts."""
    return json.dumps([{"actions": [{"name": "sleep", "params": {"seconds": i % 7}}],
                        "labels": {"batch": "bench", "n": str(i)}, "max_attempts": 3}
                       for i in range(n)]).encode()


def pgqueuer_rate(bench: Bench, n: int) -> float | None:
    if not peers_installed():
        return None
    dsn = create_database(bench.pg, f"pgqueuer_enqueue_{n}", migrated=False)
    r = subprocess.run([sys.executable, "-m", "bench.peers", "pgqueuer", "setup", dsn, str(n)],
                       cwd=REPO, capture_output=True, text=True, check=True)
    return n / float(json.loads(r.stdout.strip().splitlines()[-1])["enqueue_seconds"])


def run(bench: Bench) -> Section:
    sizes = [10_000, 100_000] if bench.quick else [10_000, 100_000, 1_000_000]
    s = Section("Enqueue from one spec list", "python -m bench.run --only enqueue",
                ["jobs", "wall (incl. start-up)", "jobs/s", "jobs/s without start-up",
                 "peak RSS", "pgqueuer bulk enqueue", "ratio", "target"])
    code, startup, _, _, _ = peak_rss_mb([*JOBFENCE, "enqueue", "--help"], bench.env(""))
    for n in sizes:
        dsn = bench.database()
        code, secs, mb, out, err = peak_rss_mb([*JOBFENCE, "enqueue", "--spec", "-"],
                                               bench.deployed_env(dsn), input=spec_list(n))
        if code != 0:
            raise RuntimeError(err.decode()[-2000:])
        assert out.count(b"\n") == n
        peer = pgqueuer_rate(bench, n) if n <= 100_000 else None
        rate = n / secs
        s.rows.append([f"{n:,}", f"{secs:.2f} s", f"{rate:,.0f}",
                       f"{n / max(secs - startup, 1e-6):,.0f}", f"{mb:.0f} MB",
                       f"{peer:,.0f}/s" if peer else "—",
                       f"{rate / peer:.2f}×" if peer else "—",
                       "≥ 30k/s, < 150 MB" if n <= 100_000 else "memory flat"])
    s.notes.append(
        f"Start-up (`jobfence enqueue --help`): {startup * 1000:.0f} ms. The list is read a "
        "spec at a time (`shared/spec_stream.py`) and validated in batches of 2,000 on a "
        "thread of its own, a batch ahead of the writes; each batch is one "
        "`jsonb_to_recordset` INSERT answering one row, its audit events by the "
        "statement-level trigger, all in one transaction; what the enqueue keeps until its "
        "commit (each batch's rows, to send again if the commit's answer is lost, and its "
        "answers) is spooled to a private temporary file, so memory does not grow with the "
        "list. One JSON object per job is printed after the commit. pgqueuer's figure is "
        "its bulk enqueue into its own table (1,000 jobs a call, no validation, no audit "
        "trail) on the same server, in the same run.")
    return s
