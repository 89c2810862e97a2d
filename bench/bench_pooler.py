"""Through PgBouncer in transaction mode: what the pooler costs a draining worker, and what
it saves the server. No-op jobs drained by N worker processes (shipped log settings),
directly and through a real PgBouncer with a pool of 4 server connections, side by side on
one server; the server's client backends are sampled while the workers run."""

from __future__ import annotations

import json
import subprocess
import threading

from bench.common import JOBFENCE, REPO, Bench, Section, create_database
from devtools.embedded_pg import EmbeddedPostgres
from devtools.pgbouncer import PgBouncer
from devtools.sqlconn import connect

POOL = 4


def drain(bench: Bench, pg: EmbeddedPostgres, route: str, pooler: str, name: str,
          procs: int, jobs: int) -> tuple[float, int]:
    """(jobs per second, most server backends of the database seen at once)."""
    direct = create_database(pg, name)
    url = direct if pooler == "none" else route + name
    env = bench.deployed_env(url)
    env["JOBFENCE_DATABASE_POOLER"] = pooler
    spec = [{"actions": [{"name": "sleep", "params": {"seconds": 0}}]}] * jobs
    subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(spec), env=env,
                   cwd=REPO, capture_output=True, text=True, check=True)
    most = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal most
        with connect(pg.dsn) as conn:
            while not done.wait(0.05):
                row = conn.execute("SELECT count(*) AS n FROM pg_stat_activity "
                                   "WHERE datname = %s", (name,)).fetchone()
                most = max(most, int(row["n"]) if row else 0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    workers = [subprocess.Popen([*JOBFENCE, "worker", "--max-jobs", str(jobs)], env=env,
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True) for _ in range(procs)]
    for w in workers:
        _, err = w.communicate()
        assert w.returncode == 0, err[-2000:]
    done.set()
    sampler.join()
    with connect(direct) as conn:
        row = conn.execute("""
            SELECT count(*) FILTER (WHERE status = 'succeeded' AND attempt_count = 1) AS ok,
                   extract(epoch FROM max(finished_at) - min(started_at))::float8 AS span
            FROM jobs""").fetchone()
    assert row is not None and row["ok"] == jobs, row
    return jobs / float(row["span"]), most


def run(bench: Bench) -> Section:
    jobs = 1000 if bench.quick else 4000
    s = Section("Through PgBouncer (transaction mode)", "python -m bench.run --only pooler",
                ["worker processes", "direct jobs/s", "server backends", "through PgBouncer "
                 "jobs/s", "server backends", "ratio"])
    with EmbeddedPostgres(durable=True) as pg, \
            PgBouncer(pg.dsn, pool_mode="transaction", default_pool_size=POOL) as bouncer:
        route = bouncer.url("")
        for procs in (2, 8):
            d, d_conns = drain(bench, pg, route, "none", f"direct_{procs}", procs, jobs)
            b, b_conns = drain(bench, pg, route, "transaction", f"pooled_{procs}", procs, jobs)
            s.rows.append([procs, f"{d:,.0f}", d_conns, f"{b:,.0f}", b_conns,
                           f"{b / d:.2f}×"])
    s.notes.append(f"{jobs:,} no-op jobs per run on a durable server, drained by `jobfence "
                   f"worker --max-jobs` at the shipped log settings; PgBouncer 1.18 with "
                   f"`default_pool_size = {POOL}`. Server backends: the most client "
                   "connections to the run's database seen at once (sampled every 50 ms): "
                   "directly, one per worker (its second, for heartbeats, opens only once a "
                   "job runs long enough to renew its lease); through PgBouncer, at most its "
                   "pool, whatever the number of workers. Every job is checked to have "
                   "succeeded on its first claim.")
    s.notes.append("The price is a second hop per round trip, through a single-threaded "
                   "PgBouncer sharing this machine's two cores with the workers and the "
                   "server: it matters for no-op jobs, not for jobs that do work. What it buys "
                   "is the server's connections: hundreds of worker pods on a pool of tens.")
    return s
