"""Cost against history: one pool's KEDA query, a claim from a queue and a sweeper pass with
10k vs 1M finished jobs in the table, spread over three queues (the same small live
workload in both). Partial indexes keep all three index scans over the live rows, so the
ratio should be near 1 (target ≤ 1.2×). Beside them, at 1M finished: a claim from a queue
of 100k ready jobs in 100 groups (tenants), round-robin on and off (target: on ≤ 1.2× off),
and with a limit on each group's running jobs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from bench.common import Bench, Section
from devtools.sqlconn import connect
from jobfence.db import Connection
from jobfence.passes import sweeper
from jobfence.passes.harness import Deps
from jobfence.settings import Settings
from jobfence.store import Store

PENDING = 500
EXPIRED = 200
QUEUES = ["default", "datums", "reports"]
QUEUE = "datums"
TENANTS, GROUPS = "tenants", 100
GROUP_MODES = {
    "as shipped": {"fair": False, "group_limit": None},
    "round-robin on": {"fair": True, "group_limit": None},
    "round-robin on, 5 running a group": {"fair": True, "group_limit": 5},
    "5 running a group, not round-robin": {"fair": False, "group_limit": 5},
}
"""The settings of ``TENANTS`` a claim is measured under (the first is the reference)."""


def fill(conn: Connection, finished: int) -> None:
    conn.execute("""
        INSERT INTO jobs (job_id, status, actions, max_attempts, attempt_count, attempt_id,
                          started_at, finished_at, created_at, queue)
        SELECT gen_random_uuid(), (ARRAY['succeeded', 'failed', 'cancelled'])[1 + i %% 3],
               '[{"name": "sleep", "params": {"seconds": 0}}]', 3, 1, gen_random_uuid(),
               now() - interval '2 days', now() - interval '1 day', now() - interval '2 days',
               (%s::text[])[1 + i %% 3]
        FROM generate_series(1, %s) AS i""", (QUEUES, finished))
    conn.execute("""
        INSERT INTO jobs (job_id, status, actions, max_attempts, queue)
        SELECT gen_random_uuid(), 'pending', '[]', 3, (%s::text[])[1 + i %% 3]
        FROM generate_series(1, %s) AS i""", (QUEUES, PENDING))
    conn.execute("VACUUM ANALYZE")  # the audit trail too: no autovacuum during the samples


def fill_tenants(conn: Connection, ready: int) -> None:
    """``ready`` ready jobs of ``TENANTS`` in ``GROUPS`` groups, and a running job in each
    group (what a limit on each group counts)."""
    conn.execute("""
        INSERT INTO jobs (job_id, status, actions, max_attempts, queue, group_key,
                          priority, visible_at)
        SELECT gen_random_uuid(), 'pending', '[]', 3, %s, 'tenant-' || (i %% %s), i %% 3,
               now() - make_interval(secs => i %% 1000)
        FROM generate_series(1, %s) AS i""", (TENANTS, GROUPS, ready))
    conn.execute("""
        INSERT INTO jobs (job_id, status, actions, max_attempts, attempt_count, attempt_id,
                          claimed_at, started_at, visible_at, queue, group_key)
        SELECT gen_random_uuid(), 'running', '[]', 3, 1, gen_random_uuid(), now(), now(),
               now() + interval '1 hour', %s, 'tenant-' || i
        FROM generate_series(0, %s - 1) AS i""", (TENANTS, GROUPS))
    conn.execute("VACUUM ANALYZE")


def expire_some(conn: Connection) -> None:
    """EXPIRED running jobs whose lease ran out (what the sweeper pass finds)."""
    conn.execute("""
        WITH pick AS (SELECT job_id FROM jobs WHERE status = 'pending' LIMIT %s)
        UPDATE jobs j SET status = 'running', attempt_id = gen_random_uuid(),
            attempt_count = 1, claimed_by = 'gone', claimed_at = now() - interval '1 hour',
            visible_at = now() - interval '1 minute'
        FROM pick WHERE j.job_id = pick.job_id""", (EXPIRED,))


def timed(fn: Callable[[], object], times: int = 1) -> float:
    """Seconds per call, over ``times`` calls in a row."""
    t0 = time.perf_counter()
    for _ in range(times):
        fn()
    return (time.perf_counter() - t0) / times


class Probe:
    """One database's connection and the three operations, measured a sample at a time."""

    def __init__(self, dsn: str) -> None:
        self.conn = connect(dsn)
        self.store = Store(self.conn)
        self.settings = Settings(database_url=dsn, retry_base_seconds=0)

    def keda(self) -> float:
        return timed(lambda: self.store.queues.scaler_value(QUEUE), 50)

    def claim(self) -> float:
        def rolled_back() -> None:
            with self.conn.transaction(force_rollback=True):
                self.store.attempts.claim(worker_id="bench", lease_seconds=60, queue=QUEUE)

        return timed(rolled_back, 20)

    def tenants(self, mode: str, limit: int) -> float:
        """A claim of ``limit`` jobs of ``TENANTS`` under ``mode``'s settings (rolled back)."""
        self.store.queues.set_groups(TENANTS, group_limit=GROUP_MODES[mode]["group_limit"],
                                     set_group_limit=True, fair=bool(GROUP_MODES[mode]["fair"]))

        def rolled_back() -> None:
            with self.conn.transaction(force_rollback=True):
                got = self.store.attempts.claim(worker_id="bench", lease_seconds=60,
                                                queue=TENANTS, limit=limit)
                assert len(got) == limit

        return timed(rolled_back, 20)

    def sweeper(self) -> float:
        expire_some(self.conn)
        took = timed(lambda: sweeper.run_once(self.settings, Deps(self.store, self.settings)))
        self.conn.execute("UPDATE jobs SET status = 'pending', attempt_count = 0, "
                          "visible_at = now() WHERE status = 'pending' "
                          "AND attempt_count > 0")
        return took

    def close(self) -> None:
        self.conn.close()


def run(bench: Bench) -> Section:
    small, big = (10_000, 200_000) if bench.quick else (10_000, 1_000_000)
    repeat = 7 if bench.quick else 25
    probes = {}
    ready = 20_000 if bench.quick else 100_000
    for n in (small, big):
        dsn = bench.database()
        with connect(dsn) as conn:
            fill(conn, n)
            if n == big:
                fill_tenants(conn, ready)
        probes[n] = Probe(dsn)
    tenants: dict[tuple[str, int], list[float]] = {(m, k): [] for m in GROUP_MODES
                                                   for k in (1, 10)}
    samples: dict[int, dict[str, list[float]]] = {
        n: {"keda": [], "claim": [], "sweeper": []} for n in probes}
    for _ in range(repeat):  # interleaved, so that the machine's noise hits both alike
        for n, probe in probes.items():
            for key in ("keda", "claim", "sweeper"):
                samples[n][key].append(getattr(probe, key)())
        for (mode, k), taken in tenants.items():
            taken.append(probes[big].tenants(mode, k))
    for probe in probes.values():
        probe.close()
    results = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in samples.items()}
    s = Section(f"Cost against history: {small:,} vs {big:,} finished jobs",
                "python -m bench.run --only history",
                ["operation", f"{small:,} finished", f"{big:,} finished", "ratio",
                 "target"])
    names = {"keda": f"KEDA query of one pool (queue `{QUEUE}`)",
             "claim": f"claim one job of `{QUEUE}`",
             "sweeper": f"sweeper pass ({EXPIRED} expired leases)"}
    for key, label in names.items():
        a, b = results[small][key], results[big][key]
        s.rows.append([label, f"{a * 1000:.2f} ms", f"{b * 1000:.2f} ms", f"{b / a:.2f}×",
                       "≤ 1.2×"])
    s.notes.append(f"Medians of {repeat} samples taken alternately on both tables (a KEDA "
                   f"sample is 50 queries, a claim sample 20 claims, a sweeper sample one pass "
                   f"over {EXPIRED} expired leases); {PENDING} pending jobs in both, the "
                   f"finished and pending jobs spread over {len(QUEUES)} queues. The claim "
                   "runs in a rolled-back transaction so every sample sees the same queue.")
    s.notes.append("Finding work costs the same at any history size (partial indexes over the "
                   "live rows: the lease scan reads ~30 buffers in both tables). What still "
                   "grows is writing: every reclaimed row gets a new version (its status is in "
                   "the partial indexes' predicates, so never a HOT update) and an audit event, "
                   "and their entries land at random places in the primary key and the audit "
                   "trail's job index, B-trees a hundred times larger at 1M. Buffers touched by "
                   "a pass differ by about 1% (EXPLAIN ANALYZE); the time, by about 10% when "
                   "the machine is quiet. Retention (`JOBFENCE_RETENTION_DEFAULT`, 30 days) keeps history bounded.")
    med = {key: statistics.median(v) for key, v in tenants.items()}
    base = next(iter(GROUP_MODES))
    lines = [f"Claims from a queue of groups (tenants), at {big:,} finished jobs: `{TENANTS}` "
             f"holds {ready:,} ready jobs in {GROUPS} groups (three priorities) and a running "
             f"job in each group; medians of {repeat} samples of 20 claims, each rolled back, "
             f"alternated with the samples above. Target: round-robin on ≤ 1.2× the claim "
             "as shipped.", "",
             "| settings of the queue | claim one | × as shipped | claim ten | × as shipped |",
             "|---|---|---|---|---|"]
    for mode in GROUP_MODES:
        lines.append(f"| {mode} | {med[mode, 1] * 1000:.2f} ms | "
                     f"{med[mode, 1] / med[base, 1]:.2f}× | {med[mode, 10] * 1000:.2f} ms | "
                     f"{med[mode, 10] / med[base, 10]:.2f}× |")
    lines += ["", "A fair claim reads one index entry a job it takes (the next group's next "
              "ready job) and one a group at its limit it passes; a claim under a per-group "
              "limit without round-robin looks first at the queue's first ready jobs in its "
              "order (a few times the claim's size), and only when those leave it short at "
              f"every group with ready work (two probes a group, {GROUPS} groups here)."]
    s.notes.append("\n" + "\n".join(lines))
    return s
