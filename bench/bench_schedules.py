"""The schedules pass with 1,000 and 10,000 schedules all due at once (every one of them
`* * * * *`, the worst minute there is): `jobfence schedules` as a subprocess, its time and
peak memory, then a second pass in the same minute (nothing due). The reference is the same
number of jobs enqueued by `jobfence enqueue --spec` from one list (the fastest way in),
and the peak memory of `python -c "import psycopg"`.

The schedules are filled with SQL (generate_series), each storing the job a `schedule add`
stores for a one-action command.
"""

from __future__ import annotations

import json
import sys

from bench.common import JOBFENCE, Bench, Section, peak_rss_mb
from devtools import sqlconn

JOB = {"actions": [{"name": "command", "params": {"argv": ["true"]}}], "resource": None,
       "priority": 0, "max_attempts": 3, "labels": {}, "ttl_seconds": None,
       "timeout_seconds": None, "expires_in_seconds": None, "spec_hash": "x",
       "queue": "default", "delay_seconds": None}


def fill(dsn: str, n: int) -> None:
    with sqlconn.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO schedules (name, cron, timezone, spec, job, next_tick_at) "
            "SELECT 's' || i, '* * * * *', 'UTC', %(spec)s::jsonb, %(job)s::jsonb, "
            "date_trunc('minute', now()) FROM generate_series(1, %(n)s) i",
            {"n": n, "job": json.dumps(JOB), "spec": json.dumps({"actions": JOB["actions"]})})


def jobs(dsn: str) -> int:
    with sqlconn.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM jobs").fetchone()
    return int(row["n"]) if row else 0


def run(bench: Bench) -> Section:
    sizes = [1_000, 10_000]
    s = Section("The schedules pass (time, peak memory)", "python -m bench.run --only schedules",
                ["schedules due", "pass time", "ticks/s", "vs `enqueue --spec` of as many",
                 "peak RSS", "vs `import psycopg`", "next pass (nothing due)"])
    _, _, base_mb, _, _ = peak_rss_mb([sys.executable, "-c", "import psycopg"], bench.env(""))
    for n in sizes:
        dsn = bench.database()
        fill(dsn, n)
        env = bench.env(dsn)
        code, secs, mb, out, err = peak_rss_mb([*JOBFENCE, "schedules"], env)
        if code != 0:
            raise RuntimeError(f"schedules failed: {err.decode()[-2000:]}")
        report = json.loads(out)
        if report["enqueued"] != n or jobs(dsn) != n:
            raise RuntimeError(f"expected {n} jobs: {report}")
        code, idle, _, out, err = peak_rss_mb([*JOBFENCE, "schedules"], env)
        if code != 0 or json.loads(out)["enqueued"] != 0:
            raise RuntimeError(f"second pass: {out!r} {err.decode()[-2000:]}")
        ref_dsn = bench.database()
        specs = json.dumps([{"actions": JOB["actions"]}] * n).encode()
        code, ref_secs, _, _, err = peak_rss_mb([*JOBFENCE, "enqueue", "--spec", "-"],
                                                bench.env(ref_dsn), input=specs)
        if code != 0:
            raise RuntimeError(f"enqueue failed: {err.decode()[-2000:]}")
        s.rows.append([f"{n:,}", f"{secs:.2f} s", f"{n / secs:,.0f}",
                       f"{secs / ref_secs:.2f}× ({ref_secs:.2f} s)", f"{mb:.0f} MB",
                       f"{mb / base_mb:.2f}× ({base_mb:.0f} MB)", f"{idle:.2f} s"])
    s.notes += [
        "Times are wall times of the whole process (start-up included), as a CronJob pays "
        "them. Each batch (`JOBFENCE_BATCH_SIZE`, 500) is one statement of the database's "
        "`scheduler_fire`: the schedules moved on, the jobs inserted, the ticks recorded. The "
        "cron expressions are evaluated in the pass (cronsim), once per distinct expression, "
        "time zone and tick: here all share one; ten thousand distinct ones add about 2 s "
        "(0.1 ms each, profiled).",
        "Peak memory is the pass's own (bench/peak.py reads the child's maximum resident set); "
        "it holds one batch at a time, so it stays flat as the schedules grow.",
    ]
    return s
