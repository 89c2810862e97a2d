"""A failover run: jobs through the shipped worker (``jobfence worker`` processes on a
multi-host URL) while the primary of a real Patroni cluster is lost, switched over, or
frozen; judged afterwards by evidence kept OUTSIDE the database, plus the audit trail.

Evidence:

* the side-effect log: every job's command appends ``start`` and ``end`` lines carrying the
  job id, the attempt id and the wall clock (``>>``: O_APPEND, one write per line);
* the ack logs, one append-only file per process: the harness's acknowledged enqueues
  (``enqueued JOB``), and each worker's JSON log — its acknowledged claims
  (``job_claimed``), terminal writes (``job_succeeded``) and every unknown outcome with how
  it was resolved (``outcome_unknown``, ``outcome_resolved``, ``outcome_unresolved``).

Besides the database faults, the long run (``make chaos-failover``) carries the worker
faults of ``make chaos`` (``worker_fault_period``, 12 s by default: SIGKILL, SIGTERM, and
SIGSTOP past the lease then SIGCONT, of a random worker) and chains of jobs on exclusive
resources (``resources``: each resource's next job enqueued, with an idempotency key, once
the one before it is terminal).

Judged (``judge``): acked enqueues missing from the database, acked terminal writes missing
(the job is not succeeded by that attempt), a job acked finished by two attempts, a command
started again after its job's finish was acked, two attempts of one job or two jobs of one
resource running at once, jobs not terminal at the drain deadline, unknown outcomes (of
terminal writes, and of claims: their jobs given back) left unresolved; and the audit-trail
invariants of ``bench.chaos_checks``.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from devtools.leader_proxy import LeaderProxy
from devtools.patroni import PatroniCluster, PatroniError
from devtools.pgbouncer import PgBouncer
from jobfence import db
from jobfence.ids import uuid7
from jobfence.store import NewJob, Store
from jobfence.store.migrations import migrate

DBNAME = "jf_failover_run"
TERMINAL = ("succeeded", "failed", "cancelled")

COMMAND = ('echo "start $JOBFENCE_JOB_ID $JOBFENCE_ATTEMPT_ID $(date +%s.%N)" >> "$SIDE"; '
           'sleep "$PAUSE"; '
           'echo "end $JOBFENCE_JOB_ID $JOBFENCE_ATTEMPT_ID $(date +%s.%N)" >> "$SIDE"')


@dataclass
class Fault:
    kind: str
    at: float
    """Wall clock of the fault."""
    detail: str = ""


@dataclass
class Run:
    cluster: PatroniCluster
    root: Path
    jobs: int = 300
    workers: int = 3
    concurrency: int = 2
    lease_seconds: float = 30.0
    pause: tuple[float, float] = (1.0, 2.5)
    """How long each job's command runs (seconds, uniform): the jobs must span the faults."""
    seed: int = 1
    resources: int = 0
    """Chains of jobs on exclusive resources (0: none): one job of each at a time."""
    worker_fault_period: float | None = None
    """Seconds between worker faults (None: none)."""
    faults: list[Fault] = field(default_factory=list)
    worker_faults: Counter[str] = field(default_factory=Counter)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    feeding: bool = True
    """Whether the resource chains still grow (not once the faults are done)."""
    _next_sweep: float = 0.0
    _next_worker_fault: float = 0.0
    _paused: list[tuple[subprocess.Popen[bytes], float]] = field(default_factory=list)
    _chain: dict[int, tuple[int, UUID | None]] = field(default_factory=dict)
    """Per resource: the number of its latest job, and that job's id once acknowledged."""
    _rng: random.Random = field(default_factory=random.Random)
    pgbouncer_workers: int = 0
    """How many of the workers reach the primary through PgBouncer (transaction pooling)
    behind a forwarder that follows the leader (``devtools.leader_proxy``), the others
    directly on the multi-host URL."""
    _bouncer: PgBouncer | None = None
    _proxy: LeaderProxy | None = None
    log_of: dict[int, Path] = field(default_factory=dict)
    """Each worker process's ack log, by pid."""
    killed: set[Path] = field(default_factory=set)
    """The ack logs of workers SIGKILLed: what they left unknown ended with them."""

    @property
    def url(self) -> str:
        return self.cluster.url(DBNAME)

    @property
    def side_log(self) -> Path:
        return self.root / "side-effects.log"

    @property
    def enqueue_log(self) -> Path:
        return self.root / "acks-enqueue.log"

    @property
    def resource_log(self) -> Path:
        """``RESOURCE JOB`` per acknowledged job of a resource chain."""
        return self.root / "acks-resources.log"

    # -- set up -------------------------------------------------------------------------

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with db.connect(self.cluster.dsn) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DBNAME} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {DBNAME}")
        with db.connect(self.url) as conn:
            migrate(conn)
        if self.pgbouncer_workers:
            def leader_port() -> int | None:
                leader = self.cluster.leader()
                return leader.pg_port if leader is not None else None

            self._proxy = LeaderProxy(leader_port).start()
            self._bouncer = PgBouncer(
                f"postgresql://postgres@127.0.0.1:{self._proxy.port}/postgres").start()

    def close(self) -> None:
        if self._bouncer is not None:
            self._bouncer.destroy()
        if self._proxy is not None:
            self._proxy.close()

    def enqueue(self) -> None:
        """Enqueue every job, acknowledging each commit in the harness's ack log."""
        rng = random.Random(self.seed)
        with db.connect(self.url) as conn, open(self.enqueue_log, "a") as acks:
            store = Store(conn)
            for start in range(0, self.jobs, 50):
                batch = [NewJob(job_id=uuid7(), max_attempts=10,
                                actions=self._action(rng.uniform(*self.pause)))
                         for _ in range(start, min(self.jobs, start + 50))]
                made = store.jobs.enqueue(batch)
                for m in made:
                    acks.write(f"enqueued {m.job_id} {time.time():.6f}\n")
                acks.flush()

    def _action(self, pause: float) -> list[dict[str, Any]]:
        return [{"name": "command", "params": {
            "argv": ["sh", "-c", COMMAND],
            "env": {"SIDE": str(self.side_log), "PAUSE": f"{pause:.2f}"}}}]

    def feed_resources(self) -> None:
        """Each resource whose latest job is terminal gets its next one (an idempotency key
        per place in the chain: an enqueue whose answer was lost is sent again as is)."""
        if not self.resources or not self.feeding:
            return
        try:
            with db.connect(self.url, connect_timeout=2) as conn:
                store = Store(conn)
                for r in range(self.resources):
                    n, job = self._chain.get(r, (0, None))
                    if job is not None:
                        row = conn.execute("SELECT status FROM jobfence.jobs WHERE job_id = %s",
                                           (job,)).fetchone()
                        if row is None or row["status"] not in TERMINAL:
                            continue
                        n += 1
                    key = f"resource-{r}-{n}"
                    [made] = store.jobs.enqueue([NewJob(
                        job_id=uuid7(), max_attempts=10, resource=f"res-{r}", priority=1,
                        idempotency_key=key, spec_hash=key,
                        actions=self._action(self._rng.uniform(*self.pause)))])
                    self._chain[r] = (n, made.job_id)
                    with open(self.enqueue_log, "a") as acks:
                        acks.write(f"enqueued {made.job_id} {time.time():.6f}\n")
                    with open(self.resource_log, "a") as acks:
                        acks.write(f"res-{r} {made.job_id}\n")
        except Exception:  # an outage: the chain grows again once the writer answers
            return

    def worker_fault(self) -> None:
        """SIGKILL, SIGTERM, or SIGSTOP past the lease (SIGCONT later) of a random worker."""
        now = time.monotonic()
        for w, at in [p for p in self._paused if p[1] <= now]:
            with _quiet():
                w.send_signal(signal.SIGCONT)
        self._paused = [p for p in self._paused if p[1] > now]
        if self.worker_fault_period is None or now < self._next_worker_fault:
            return
        self._next_worker_fault = now + self._rng.uniform(0.5, 1.5) * self.worker_fault_period
        paused = {w.pid for w, _ in self._paused}
        live = [w for w in self.procs if w.poll() is None and w.pid not in paused]
        if not live:
            return
        w = self._rng.choice(live)
        kind = self._rng.choice(("SIGKILL", "SIGTERM", "SIGSTOP"))
        with _quiet():
            w.send_signal(getattr(signal, kind))
            self.worker_faults[kind] += 1
            if kind == "SIGKILL":
                self.killed.add(self.log_of[w.pid])
            if kind == "SIGSTOP":
                self._paused.append((w, now + self.lease_seconds + self._rng.uniform(0.5, 2.5)))

    def resume_all(self) -> None:
        for w, _ in self._paused:
            with _quiet():
                w.send_signal(signal.SIGCONT)
        self._paused = []

    # -- workers and periodic passes ----------------------------------------------------

    def route(self, n: int) -> str:
        """How worker ``n`` reaches the primary: ``direct`` or ``pgbouncer``."""
        return "pgbouncer" if n < self.pgbouncer_workers else "direct"

    def env(self, route: str = "direct") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
        env.pop("PYTHONPATH", None)
        if route == "pgbouncer":
            assert self._bouncer is not None
            env.update({"JOBFENCE_DATABASE_URL": self._bouncer.url(DBNAME),
                        "JOBFENCE_DATABASE_POOLER": "transaction"})
        env.update({"JOBFENCE_LOG_FORMAT": "json",
                    "JOBFENCE_LEASE_SECONDS": str(self.lease_seconds),
                    "JOBFENCE_CONNECT_TIMEOUT_SECONDS": "2",
                    "JOBFENCE_RETRY_BASE_SECONDS": "0.5",
                    "JOBFENCE_COMMAND_USER": "worker"})
        env.setdefault("JOBFENCE_DATABASE_URL", self.url)
        return env

    def start_worker(self, n: int) -> None:
        path = self.root / f"acks-worker-{n}-{self.route(n)}-{time.time():.0f}.log"
        log = open(path, "ab")
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "jobfence.functions.cli", "worker",
             "--max-jobs", "10000000", "--max-seconds", "3600", "--idle-seconds", "3600",
             "--concurrency", str(self.concurrency)],
            env=self.env(self.route(n)), stdout=subprocess.DEVNULL, stderr=log))
        self.log_of[self.procs[-1].pid] = path
        log.close()

    def sweep(self) -> None:
        subprocess.run([sys.executable, "-m", "jobfence.functions.cli", "sweeper"],
                       env=self.env(), capture_output=True, timeout=120, check=False)

    def keep_workers(self) -> None:
        """A worker that exited (an outage it could not ride out) is replaced, as KEDA
        would start another."""
        for i, p in enumerate(self.procs):
            if p.poll() is not None and p.pid not in {w.pid for w, _ in self._paused}:
                self.procs.pop(i)
                self.start_worker(i)
                return

    def stop_workers(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # -- the run ------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        try:
            with db.connect(self.url, connect_timeout=2) as conn:
                rows = conn.execute("SELECT status, count(*) AS n FROM jobfence.jobs "
                                    "GROUP BY status").fetchall()
        except Exception:
            return {}
        return {r["status"]: int(r["n"]) for r in rows}

    def wait(self, seconds: float, until: Callable[[], bool] | None = None) -> None:
        """Let the run go on: replace exited workers, sweep every few seconds (as the
        sweeper's CronJob would, more often)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.worker_fault()
            self.keep_workers()
            self.feed_resources()
            if time.monotonic() >= self._next_sweep:
                self.sweep()
                self._next_sweep = time.monotonic() + 5.0
            if until is not None and until():
                return
            time.sleep(1.0)

    def drained(self) -> bool:
        c = self.counts()
        return (bool(c) and sum(c.get(s, 0) for s in TERMINAL) >= self.jobs
                and sum(c.values()) == sum(c.get(s, 0) for s in TERMINAL))

    def fault(self, kind: str) -> None:
        """One fault of ``kind``: node_loss, switchover, failover, freeze,
        lag_then_node_loss."""
        cluster = self.cluster
        leader = cluster.leader()
        assert leader is not None, "no leader to fault"
        self.faults.append(Fault(kind, time.time(), leader.name))
        if kind == "node_loss":
            cluster.kill(leader)
            try:
                cluster.wait_until(lambda: cluster.leader() not in (None, leader), 120,
                                   "no new leader")
            except PatroniError:  # strict mode promotes no standby it has not named
                self.faults[-1].detail += " (no standby promoted: the old primary restarted)"
            cluster.start_member(leader)
        elif kind in ("switchover", "failover"):
            if kind == "switchover":
                cluster.switchover()
            else:  # an operator's failover (patronictl failover): to the synchronous standby
                sync = [r["name"] for r in cluster.status() if r.get("role") == "sync_standby"]
                cluster.failover(sync[0] if sync else None)
            cluster.wait_until(lambda: cluster.leader() not in (None, leader), 120,
                               "no new leader")
        elif kind == "freeze":
            cluster.freeze(leader)
            self.wait(cluster.ttl + 5)
            cluster.thaw(leader)
        elif kind == "lag_then_node_loss":
            # The primary's WAL senders stopped: the standbys fall behind while the primary
            # goes on acknowledging (asynchronous) or waits (synchronous); then it is lost.
            senders = [p for p in leader.server_pids() if b"walsender" in _cmdline(p)]
            for p in senders:
                os.kill(p, signal.SIGSTOP)
            self.wait(4)
            cluster.kill(leader)
            for p in senders:
                with _quiet():
                    os.kill(p, signal.SIGKILL)
            cluster.wait_until(lambda: cluster.leader() not in (None, leader), 120,
                               "no new leader")
            cluster.start_member(leader)
        else:
            raise ValueError(kind)

    def run(self, kinds: list[str], drain_seconds: float = 240) -> Judgement:
        self.prepare()
        for n in range(self.workers):
            self.start_worker(n)
        self.enqueue()
        self._rng = random.Random(self.seed + 1)
        self._next_worker_fault = time.monotonic() + (self.worker_fault_period or 0)
        for kind in kinds:
            # Each fault from a healthy cluster (a synchronous standby named again after the
            # last one: strict mode promotes no other), then a few seconds of work.
            if not self.cluster.healthy():
                self.wait(180, until=self.cluster.healthy)
            self.wait(6)
            self.fault(kind)
        self.feeding = False
        self.worker_fault_period = None  # the faults are done: the run drains
        try:
            self.cluster.wait_healthy(180)
        finally:
            self.resume_all()
            self.wait(drain_seconds, until=self.drained)
            self.stop_workers()
            self.close()
        return judge(self)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, ProcessLookupError)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# -- the judgement ----------------------------------------------------------------------------


@dataclass
class Judgement:
    violations: dict[str, list[Any]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    timings: list[dict[str, Any]] = field(default_factory=list)
    """Per fault: its kind, the seconds to the first claim after it, and the seconds to
    the last end (terminal write acked, self-fence) of a claim made before it."""

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def summary(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.counts.items()]
        lines += [f"fault {t['kind']} ({t['route']}): first new claim after "
                  f"{t['first_claim']} s, last "
                  f"old claim resolved after {t['old_resolved']} s" for t in self.timings]
        lines += [f"VIOLATION {k}: {v[:5]}" for k, v in self.violations.items() if v]
        return "\n".join(lines)


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _timings(faults: list[Fault], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fault and per route (direct, pgbouncer) its workers took."""
    routes = sorted({e["route"] for e in events})
    return [t for route in routes for t in _route_timings(
        faults, [e for e in events if e["route"] == route], route)]


def _route_timings(faults: list[Fault], events: list[dict[str, Any]],
                   route: str) -> list[dict[str, Any]]:
    claimed_at: dict[str, float] = {}
    ended_at: dict[str, float] = {}
    for e in events:
        attempt = e.get("attempt_id")
        if not attempt or "timestamp" not in e:
            continue
        if e.get("event") == "job_claimed":
            claimed_at[attempt] = _epoch(e["timestamp"])
        elif e.get("event") in ("job_succeeded", "self_fenced", "writeback_stale_attempt"):
            ended_at[attempt] = _epoch(e["timestamp"])
    out = []
    for f in faults:
        after = [t for t in claimed_at.values() if t > f.at]
        old = [ended_at[a] for a, t in claimed_at.items() if t <= f.at and a in ended_at
               and ended_at[a] > f.at]
        out.append({"kind": f.kind, "route": route,
                    "first_claim": round(min(after) - f.at, 1) if after else None,
                    "old_resolved": round(max(old) - f.at, 1) if old else 0.0})
    return out


def judge(run: Run) -> Judgement:
    """Judge a finished run by the evidence outside the database, then the audit trail."""
    from bench.chaos_checks import ack_counts, acked_events, check_acks, check_database

    out = Judgement()
    v = out.violations
    enqueued = [UUID(line.split()[1]) for line in run.enqueue_log.read_text().splitlines()]
    events = acked_events(sorted(run.root.glob("acks-worker-*.log")), run.killed)
    finished: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for e in events:
        if e.get("event") == "job_succeeded":
            finished[e["job_id"]].append((e["attempt_id"], _epoch(e["timestamp"])))
    starts: dict[str, list[tuple[str, float]]] = defaultdict(list)
    runs: dict[tuple[str, str], list[float]] = {}
    if run.side_log.exists():
        for line in run.side_log.read_text().splitlines():
            parts = line.split()
            if len(parts) != 4:
                continue
            what, job, attempt, at = parts[0], parts[1], parts[2], float(parts[3])
            if what == "start":
                starts[job].append((attempt, at))
                runs[(job, attempt)] = [at, float("inf")]
            elif what == "end" and (job, attempt) in runs:
                runs[(job, attempt)][1] = at

    with db.connect(run.url) as conn:
        conn.execute("SET search_path = jobfence")  # the audit checks name tables bare
        rows = {str(r["job_id"]): r for r in conn.execute(
            "SELECT job_id, status, attempt_id FROM jobfence.jobs").fetchall()}
        for verdict in check_acks(conn, events):
            v[verdict.name] = verdict.violations
        for verdict in check_database(conn):
            if verdict.violations:
                v[f"audit: {verdict.name}"] = verdict.violations

    v["acked enqueue missing"] = [str(j) for j in enqueued if str(j) not in rows]
    v["command started again after an acked finish"] = [
        (job, attempt) for job, acks in finished.items()
        for attempt, at in starts.get(job, []) if at > min(t for _, t in acks)]
    overlaps = []
    by_job: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (job, _attempt), (began, ended) in runs.items():
        if ended != float("inf"):  # a killed child left no end: its span is unknown
            by_job[job].append((began, ended))
    for job, spans in by_job.items():
        spans.sort()
        overlaps += [job for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    v["two attempts of one job at once"] = overlaps
    resource_of: dict[str, str] = {}  # job -> resource
    if run.resource_log.exists():
        for line in run.resource_log.read_text().splitlines():
            if len(parts := line.split()) == 2:
                resource_of[parts[1]] = parts[0]
    by_resource: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for (job, _attempt), (began, ended) in runs.items():
        if job in resource_of and ended != float("inf"):  # as above: span unknown
            by_resource[resource_of[job]].append((began, ended, job))
    v["two jobs of one resource at once"] = [
        (res, a[2], b[2]) for res, spans in by_resource.items()
        for a, b in itertools.pairwise(sorted(spans)) if a[2] != b[2] and b[0] < a[1]]
    v["job not terminal at the drain deadline"] = [
        j for j, r in rows.items() if r["status"] not in TERMINAL]
    out.timings = _timings(run.faults, events)
    out.counts = {
        "jobs": len(rows), "acked enqueues": len(enqueued),
        **ack_counts(events),
        "command starts": sum(len(s) for s in starts.values()),
        "resource jobs": len(resource_of),
        "faults": len(run.faults),
        **{f"worker {k}": n for k, n in sorted(run.worker_faults.items())},
    }
    return out


KINDS = ("node_loss", "switchover", "failover", "freeze")


def main(argv: list[str] | None = None) -> int:
    """``make chaos-failover``: a long failover run, its faults drawn (seeded) from
    ``KINDS``; prints the counts, the faults and every violation; exit 1 on one."""
    import argparse
    import tempfile

    p = argparse.ArgumentParser(prog="python -m bench.chaos_failover")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--faults", type=int, default=24)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--asynchronous", action="store_true",
                   help="Patroni's default replication (the positive control)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--resources", type=int, default=4,
                   help="chains of jobs on exclusive resources")
    p.add_argument("--pgbouncer-workers", type=int, default=2,
                   help="workers through PgBouncer behind a leader-following forwarder")
    p.add_argument("--worker-fault-period", type=float, default=12.0,
                   help="seconds between worker faults (0: none). make chaos injects one "
                        "a second at a 3 s lease; at this run's 30 s lease a SIGSTOP past "
                        "it lasts 30 s, and one every 2 s would keep most workers stopped")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    kinds = [rng.choice(KINDS) for _ in range(args.faults)]
    cluster = PatroniCluster(synchronous=not args.asynchronous)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # interrupted: clean up all
    run: Run | None = None
    try:
        cluster.start()
        run = Run(cluster, Path(tempfile.mkdtemp(prefix="jobfence-failover-run-")),
                  jobs=args.jobs, workers=args.workers, seed=args.seed,
                  resources=args.resources, pgbouncer_workers=args.pgbouncer_workers,
                  worker_fault_period=args.worker_fault_period or None)
        judged = run.run(kinds, drain_seconds=600)
        for f in run.faults:
            print(f"fault {f.kind} at {f.at:.1f} on {f.detail}")
        print(judged.summary())
        print(f"evidence kept in {run.root}")
        return 0 if judged.ok else 1
    finally:
        if run is not None:
            run.resume_all()
            run.stop_workers()
            run.close()
        cluster.destroy()


if __name__ == "__main__":
    sys.exit(main())
