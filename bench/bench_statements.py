"""What each per-job write costs the server: `pg_stat_statements` (statements inside the
worker's functions and the audit triggers included, `track = all`) over a run of no-op
jobs, one worker process at one job at a time and at ten at once. Each row is a statement,
its calls per job, and its execution time per job; the top-level `SELECT ... FROM
worker_*()` calls include the time of the statements nested in them."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from bench.common import JOBFENCE, REPO, Bench, Section, create_database
from devtools.embedded_pg import EmbeddedPostgres
from devtools.sqlconn import connect

CONCURRENCY = (1, 10)


def short(query: str) -> str:
    q = " ".join(query.split())
    m = re.search(r"(worker_\w+|jobfence_\w+|settle_dependents|resolve_waiting)\(", q)
    if q.startswith("SELECT") and m and "FROM" in q[:60]:
        return f"`{m.group(1)}()` (the call)"
    words = q.split(" ")
    head = " ".join(words[:6])
    table = re.search(r"(?:INTO|UPDATE|FROM)\s+\"?jobfence\"?\.\"?(\w+)", q)
    return f"`{head[:60]}…`" + (f" ({table.group(1)})" if table else "")


def profile(bench: Bench, pg: EmbeddedPostgres, jobs: int,
            concurrency: int) -> list[tuple[str, float, float]]:
    dsn = create_database(pg, f"statements_{concurrency}")
    env = bench.deployed_env(dsn)
    spec = [{"actions": [{"name": "sleep", "params": {"seconds": 0}}]}] * jobs
    subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(spec), env=env,
                   cwd=REPO, capture_output=True, text=True, check=True)
    with connect(pg.url(f"statements_{concurrency}")) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    subprocess.run([*JOBFENCE, "worker", "--max-jobs", str(jobs), "--concurrency",
                    str(concurrency)], env=env, cwd=REPO, capture_output=True, check=True)
    with connect(pg.url(f"statements_{concurrency}")) as conn:
        rows = conn.execute("""
            SELECT s.query, s.calls, s.total_exec_time
            FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
            WHERE d.datname = current_database()
              AND s.query NOT ILIKE '%%pg_stat_statements%%'
              AND s.query NOT ILIKE '%%jobfence_identity%%'
            ORDER BY s.total_exec_time DESC LIMIT 10""").fetchall()
    return [(short(r["query"]), r["calls"] / jobs, r["total_exec_time"] / jobs * 1000)
            for r in rows]


def run(bench: Bench) -> Section:
    jobs = 1000 if bench.quick else 4000
    s = Section("What each per-job write costs the server",
                "python -m bench.run --only statements",
                ["jobs at once", "statement", "calls per job", "execution µs per job"])
    with EmbeddedPostgres(durable=True, settings={
            "shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track": "all"}) as pg:
        for c in CONCURRENCY:
            for name, calls, us in profile(bench, pg, jobs, c):
                row: list[Any] = [c, name, f"{calls:.2f}", f"{us:.0f}"]
                s.rows.append(row)
    s.notes.append(f"{jobs:,} no-op jobs, one worker process, a durable server. Execution "
                   "time only: a commit (the WAL flush) and the round trip come on top, "
                   "once per terminal write batch.")
    s.notes.append("What each per-job write is, one job at a time: the claim "
                   "(`worker_claim`: the candidate scan `FOR UPDATE SKIP LOCKED` and its "
                   "UPDATE with a fresh `attempt_id`), the fenced terminal write "
                   "(`worker_finish_many`: the UPDATE matched on job, attempt and a live "
                   "lease, with the last action's result), the audit trigger of each of "
                   "those two statements (`job_events`: one event per job; and the metric "
                   "deltas, `WITH t AS MATERIALIZED …`, one statement per transition "
                   "statement), and `settle_dependents` after each terminal write's commit "
                   "(a second transaction in the same round trip, so that an `after` job "
                   "enqueued meanwhile is never missed). With ten jobs at once the triggers "
                   "and the settling run once per batch, not per job: their calls per job "
                   "fall by the batch size, while the row work (the UPDATEs, one event per "
                   "job) stays.")
    s.notes.append("What made a job dearer since the first benchmarks, in the order the "
                   "table shows: the metric deltas in the audit trigger (0015, 0020), "
                   "settling dependents after every terminal write (0014's read-after-commit "
                   "rule, a plpgsql call even when nothing waits), and every worker verb "
                   "becoming a `SECURITY DEFINER` function with a pinned `search_path` "
                   "(0014, 0019: a function call that PostgreSQL cannot inline, with a "
                   "setting saved and restored around it). Each protects something (the "
                   "metrics, the `after` race, least privilege against a hostile login); "
                   "none is removed. What is fixed is how often they run: batched claims, "
                   "heartbeats and terminal writes pay them per statement, so a worker "
                   "running many jobs pays them once per batch.")
    return s
