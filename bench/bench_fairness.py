"""Fair shares under load: one tenant's backlog of no-op jobs queued first, then a second
tenant's few jobs arriving while two draining workers (the shipped pool's ``--concurrency
10``) work the backlog off. How long the late tenant's jobs waited for a worker (enqueue to
claim, by the database's clock), with the queue as it ships (no groups settings) and with a
limit on each group's running jobs and round-robin on — the same run otherwise, alternated.
With round-robin the late jobs should start within one round of claims; without it, behind
the whole backlog."""

from __future__ import annotations

import json
import statistics
import subprocess
import time

from bench.common import JOBFENCE, REPO, Bench, Section, create_database, p95
from devtools.sqlconn import connect

QUEUE = "tenants"
PROCESSES = 2
CONCURRENCY = 10
GROUP_LIMIT = 10


CONFIGS = {
    "as shipped (no group settings)": (),
    f"`queue fair {QUEUE} on`": (("queue", "fair", QUEUE, "on"),),
    f"`queue fair {QUEUE} on`, `queue limit {QUEUE} {GROUP_LIMIT} --per-group`": (
        ("queue", "fair", QUEUE, "on"),
        ("queue", "limit", QUEUE, str(GROUP_LIMIT), "--per-group")),
}
"""Each configuration of the queue measured, and the commands that set it."""


def one_run(bench: Bench, name: str, backlog: int, late: int,
            settings: tuple[tuple[str, ...], ...]) -> dict[str, float]:
    dsn = create_database(bench.pg, name, migrated=False)
    env = bench.deployed_env(dsn)

    def jf(*args: str, spec: object = None) -> None:
        subprocess.run([*JOBFENCE, *args], env=env, cwd=REPO, check=True,
                       capture_output=True, text=True,
                       input=None if spec is None else json.dumps(spec))

    def specs(group: str, n: int) -> list[dict[str, object]]:
        return [{"actions": [{"name": "sleep", "params": {"seconds": 0}}], "queue": QUEUE,
                 "group": group}] * n

    jf("migrate")
    for command in settings:
        jf(*command)
    jf("enqueue", "--spec", "-", spec=specs("bulk", backlog))
    total = backlog + late
    workers = [subprocess.Popen([*JOBFENCE, "worker", "--queue", QUEUE, "--max-jobs",
                                 str(total), "--concurrency", str(CONCURRENCY),
                                 "--idle-seconds", "3"],
                                env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for _ in range(PROCESSES)]
    with connect(dsn) as conn:
        while conn.execute("SELECT count(*) AS n FROM jobs WHERE status <> 'pending'"
                           ).fetchone()["n"] < backlog // 10:
            time.sleep(0.02)  # the workers are into the backlog
    jf("enqueue", "--spec", "-", spec=specs("late", late))
    for w in workers:
        w.wait(timeout=600)
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT group_key, extract(epoch FROM claimed_at - created_at) AS wait "
            "FROM jobs WHERE queue = %s", (QUEUE,)).fetchall()
        left = conn.execute("SELECT count(*) AS n FROM jobs WHERE status <> 'succeeded'"
                            ).fetchone()["n"]
        # Claims of the backlog made after the late jobs came and before the last of them.
        ahead = conn.execute("""
            WITH late AS (SELECT min(created_at) AS came, max(claimed_at) AS last
                          FROM jobs WHERE group_key = 'late')
            SELECT count(*) AS n FROM jobs j, late
            WHERE j.group_key = 'bulk' AND j.claimed_at > late.came
              AND j.claimed_at < late.last""").fetchone()["n"]
        span = conn.execute("SELECT extract(epoch FROM max(finished_at) - min(claimed_at)) "
                            "AS s FROM jobs").fetchone()["s"]
    assert left == 0, f"{left} jobs did not succeed"
    waits = sorted(float(r["wait"]) for r in rows if r["group_key"] == "late")
    return {"median": statistics.median(waits), "p95": p95(waits), "max": waits[-1],
            "ahead": float(ahead), "rate": total / float(span)}


def run(bench: Bench) -> Section:
    backlog, late = (2_000, 20) if bench.quick else (10_000, 50)
    rounds = 1 if bench.quick else 2
    results: dict[str, list[dict[str, float]]] = {label: [] for label in CONFIGS}
    for r in range(rounds):
        for i, (label, settings) in enumerate(CONFIGS.items()):
            results[label].append(one_run(bench, f"fair_{r}_{i}", backlog, late, settings))
    s = Section(f"Fair shares: {late} jobs of a second tenant behind {backlog:,} of a first",
                "python -m bench.run --only fairness",
                ["queue", "late tenant's wait: median", "p95", "max",
                 "backlog claims before its last", "jobs/s", "target"])
    for label, runs in results.items():
        med = {k: statistics.median(x[k] for x in runs)
               for k in ("median", "p95", "max", "ahead", "rate")}
        s.rows.append([label, f"{med['median'] * 1000:,.0f} ms",
                       f"{med['p95'] * 1000:,.0f} ms", f"{med['max'] * 1000:,.0f} ms",
                       f"{med['ahead']:,.0f}", f"{med['rate']:,.0f}",
                       "within one round of claims" if CONFIGS[label] else "-"])
    s.notes.append(
        f"{PROCESSES} worker processes, each `jobfence worker --concurrency {CONCURRENCY}` "
        f"(the draining pool's shipped arguments), no-op jobs; the first tenant's {backlog:,} "
        f"jobs enqueued, the workers started, and the second tenant's {late} enqueued once a "
        f"tenth of the backlog is done. A wait is `claimed_at - created_at` of each late "
        f"job, by the database's clock; the backlog's claims before the last late job's, those "
        f"claimed after the late jobs came; jobs/s, every job's first claim to the last "
        f"terminal write. Medians over {rounds} alternated run(s) of each.")
    return s
