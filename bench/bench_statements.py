"""What each per-job write costs the server: `pg_stat_statements` (statements inside the
worker's functions and the audit triggers included, `track = all`) over a run of no-op
jobs, one worker process at one job at a time and at ten at once. Each row is a statement,
its calls per job, and its execution time per job; the top-level `SELECT ... FROM
worker_*()` calls include the time of the statements nested in them. With ``--against
PYTHON`` an earlier checkout (its migrate, its enqueue, its worker) is measured beside this
one, on the same server: before and after, per statement."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from typing import Any

from bench.common import JOBFENCE, REPO, Bench, Section
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


def profile(bench: Bench, pg: EmbeddedPostgres, jobs: int, concurrency: int,
            command: Sequence[str] = JOBFENCE, tag: str = "") -> dict[str, tuple[float, float]]:
    """Each statement's calls and execution µs per job over a worker's run of ``jobs``
    no-op jobs, ``command`` (this checkout's, or an earlier one's) having migrated the
    database, enqueued them and run the worker."""
    name = f"statements_{concurrency}{tag}"
    _, env = bench.noop_jobs(pg, name, jobs, command)
    with connect(pg.url(name)) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    subprocess.run([*command, "worker", "--max-jobs", str(jobs), "--concurrency",
                    str(concurrency)], env=env, cwd=REPO, capture_output=True, check=True)
    with connect(pg.url(name)) as conn:
        rows = conn.execute("""
            SELECT s.query, s.calls, s.total_exec_time
            FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
            WHERE d.datname = current_database()
              AND s.query NOT ILIKE '%%pg_stat_statements%%'
              AND s.query NOT ILIKE '%%jobfence_identity%%'
            ORDER BY s.total_exec_time DESC LIMIT 12""").fetchall()
    out: dict[str, tuple[float, float]] = {}
    for r in rows:
        calls, us = out.get(short(r["query"]), (0.0, 0.0))
        out[short(r["query"])] = (calls + r["calls"] / jobs,
                                  us + r["total_exec_time"] / jobs * 1000)
    return out


def run(bench: Bench) -> Section:
    jobs = 1000 if bench.quick else 4000
    versions = bench.versions()
    header = ["jobs at once", "statement"]
    header += [f"{v}{c}" for v in versions for c in ("calls per job", "execution µs per job")]
    s = Section("What each per-job write costs the server",
                "python -m bench.run --only statements", header)
    with EmbeddedPostgres(durable=True, settings={
            "shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track": "all"}) as pg:
        for c in CONCURRENCY:
            seen = {v: profile(bench, pg, jobs, c, command, f"_{i}")
                    for i, (v, command) in enumerate(versions.items())}
            names = sorted({n for one in seen.values() for n in one},
                           key=lambda n: -max(one.get(n, (0, 0))[1] for one in seen.values()))
            for n in names[:10]:
                row: list[Any] = [c, n]
                for one in seen.values():
                    calls, us = one.get(n, (0.0, 0.0))
                    row += [f"{calls:.2f}", f"{us:.0f}"] if n in one else ["—", "—"]
                s.rows.append(row)
    s.notes.append(f"{jobs:,} no-op jobs, one worker process, a durable server. Execution "
                   "time only: a commit (the WAL flush) and the round trip come on top, "
                   "once per terminal write batch.")
    s.notes.append("What each per-job write is, one job at a time: the claim "
                   "(`worker_claim`: the candidate scan `FOR UPDATE SKIP LOCKED` and its "
                   "UPDATE with a fresh `attempt_id`), the fenced terminal write "
                   "(`worker_finish`, a batch's `worker_finish_many`: the UPDATE matched "
                   "on job, attempt and a live lease, with the last action's result), the audit trigger of each of "
                   "those two statements (`job_events`: one event per job; and the metric "
                   "deltas, `WITH t AS MATERIALIZED …`, one statement per transition "
                   "statement), and `settle_dependents` after each terminal write's commit "
                   "(a second transaction in the same round trip, so that an `after` job "
                   "enqueued meanwhile is never missed). With ten jobs at once the triggers "
                   "and the settling run once per batch, not per job: their calls per job "
                   "fall by the batch size, while the row work (the UPDATEs, one event per "
                   "job) stays.")
    s.notes.append("What made a job dearer since the first benchmarks: the metric deltas in "
                   "the audit triggers (0015, 0020, 0029), settling dependents after every "
                   "terminal write (0014's read-after-commit rule), and every worker verb "
                   "becoming a `SECURITY DEFINER` function with a pinned `search_path` "
                   "(0014, 0019). Each protects something (the metrics, the `after` race, "
                   "least privilege against a hostile login); none is removed. What was "
                   "cut (2026-11-29): the histogram helpers the triggers call "
                   "(`jobfence_buckets`, `jobfence_bucket`, `jobfence_observation`, "
                   "`jobfence_usage`) carried a `SET search_path` of their own, which keeps "
                   "PostgreSQL from inlining a function: each call planned and ran its body "
                   "as a query of its own, ~100 µs a bucket in a trigger of one job's write "
                   "(they name every object with the schema and run inside the triggers' "
                   "pinned path); the single terminal write and the per-action writes were "
                   "`LANGUAGE sql` definer functions, which PostgreSQL plans at every call "
                   "(a definer function is never inlined), now PL/pgSQL, planned once per "
                   "connection; migration 0041 drops three indexes every enqueue or "
                   "terminal write paid for and no query reads (`jobs_ready`, "
                   "`jobs_retention_ttl`, `jobs_retention_default`). *before* is the "
                   "checkout before these changes (cfedcfa), measured in the same run.")
    return s
