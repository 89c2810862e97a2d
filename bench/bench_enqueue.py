"""Enqueue of 10k jobs from one spec list (`jobfence enqueue --spec -`): every spec
validated, all inserted in one transaction with their audit events. Target ≥ 10k jobs/s
(moonshot 30k/s); the process's start-up is included, and reported apart."""

from __future__ import annotations

import json

from bench.common import JOBFENCE, Bench, Section, peak_rss_mb


def run(bench: Bench) -> Section:
    sizes = [2_000, 10_000] if bench.quick else [10_000, 50_000]
    s = Section("Enqueue from one spec list", "python -m bench.run --only enqueue",
                ["jobs", "wall (incl. start-up)", "jobs/s", "jobs/s without start-up",
                 "peak RSS", "target"])
    code, startup, _, _, _ = peak_rss_mb([*JOBFENCE, "enqueue", "--help"], bench.env(""))
    for n in sizes:
        dsn = bench.database()
        spec = [{"actions": [{"name": "sleep", "params": {"seconds": 1}}],
                 "labels": {"batch": "bench"}, "max_attempts": 3} for _ in range(n)]
        code, secs, mb, out, err = peak_rss_mb([*JOBFENCE, "enqueue", "--spec", "-"],
                                               bench.env(dsn), input=json.dumps(spec).encode())
        if code != 0:
            raise RuntimeError(err.decode()[-2000:])
        assert len(out.decode().splitlines()) == n
        s.rows.append([f"{n:,}", f"{secs:.2f} s", f"{n / secs:,.0f}",
                       f"{n / max(secs - startup, 1e-6):,.0f}", f"{mb:.0f} MB", "≥ 10k/s"])
    s.notes.append(f"Start-up (`jobfence enqueue --help`): {startup * 1000:.0f} ms. One JSON "
                   "object per job is printed. Each spec is validated by pydantic (the "
                   "largest share), each distinct action's params once; the rows go in as "
                   "one `jsonb_to_recordset` INSERT per call, audit events by one "
                   "statement-level trigger. The whole list is read and held at once, so "
                   "memory grows with its size; split very large lists.")
    return s
