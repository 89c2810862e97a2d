"""`make chaos`: jobfence under fire, judged by its audit trail.

Thousands of jobs of every kind — plain, on exclusive resources, flaky with retries, with
run timeouts, chained by dependencies, datum parents on S3, workflows whose steps hand
their files on — in three queues, while worker
processes are started continuously the way KEDA would (devtools/platform.py, each pool's
own trigger query): one job per pod for maintenance work, draining workers for short work,
and draining workers of a queue limited to 2 running jobs. The periodic functions run on a
compressed schedule (slower once the faults stop: ``DRAIN_PACE``). A fault injector
meanwhile SIGKILLs, SIGTERMs and pauses workers past their lease (SIGSTOP, then SIGCONT),
terminates worker database connections, cancels jobs, and restarts PostgreSQL once.

Then the faults stop, the system drains, and bench/chaos_checks.py judges the run from the
audit trail and the object store, and — evidence kept outside the database, as the failover
run keeps it — from what each worker was acknowledged (its JSON log: claims, terminal
writes, unknown outcomes and how they were resolved). The server is durable: a crash stop
must not lose an acknowledged commit. A table of faults injected and invariants checked is
printed; the exit code is 1 on any violation.

    python -m bench.chaos                      # full size: 3,000 jobs
    python -m bench.chaos --jobs 120 --quick --pgbouncer
                                               # the short run `make test` includes:
                                               # every process through PgBouncer
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.chaos_checks import (
    Verdict,
    acked_events,
    check_acks,
    check_database,
    check_handed,
    check_manifests,
    check_overlaps,
)
from devtools.embedded_pg import EmbeddedPostgres
from devtools.pgbouncer import PgBouncer
from devtools.platform import LocalPlatform, Proc
from devtools.s3 import moto_server
from devtools.sqlconn import connect
from jobfence import workflows
from jobfence.adapters.s3 import S3ObjectStore
from jobfence.errors import JobfenceError, ResourceBusy, StoreUnavailable
from jobfence.functions.cli import COMMANDS
from jobfence.pools import Pool
from jobfence.settings import Settings
from jobfence.spec import parse_specs
from jobfence.store import ACTIVE, Store
from jobfence.store.migrations import migrate
from jobfence.submit import submit

LEASE = 3.0
LIMIT = 2
BUCKET = "chaos"
RESOURCES = [f"db.table_{i}" for i in range(12)]
SCHEDULE = {"sweeper": 1.0, "reconciliation": 1.5, "export-finalize": 1.0, "lifecycle": 2.0,
            "orphan-cleanup": 3.0}
DRAIN_PACE = 4.0
"""Once the faults stop, the periodic functions run this many times less often: every
race between them and the workers has had its compressed schedule, and on two cores their
own process starts (several a second) would take most of the CPU the draining workers
need — the long run's queue drained at about one job a second before."""


def pools(workers: int) -> tuple[Pool, ...]:
    """Three pools as manifests/pools.yaml declares them: maintenance work one job per
    pod, short work on draining workers running four jobs at once, and a draining pool
    whose queue is limited to fewer running jobs than one of its pods would run."""
    half = max(1, workers // 2)
    return (Pool(name="default", mode="one-per-pod", maxPods=half),
            Pool(name="datums", mode="draining", maxJobs=20, maxSeconds=20, concurrency=4,
                 maxPods=max(1, workers - half)),
            Pool(name="limited", mode="draining", maxJobs=20, maxSeconds=20, concurrency=3,
                 maxPods=4))


def chaos_env(dsn: str, s3: str, pooler: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    env.update({
        "JOBFENCE_DATABASE_URL": dsn, "JOBFENCE_DATABASE_POOLER": pooler,
        "JOBFENCE_LEASE_SECONDS": str(LEASE), "JOBFENCE_HEARTBEAT_SECONDS": "0.4",
        "JOBFENCE_RETRY_BASE_SECONDS": "0.2", "JOBFENCE_RETRY_MAX_SECONDS": "2",
        "JOBFENCE_CONNECT_TIMEOUT_SECONDS": "2", "JOBFENCE_RECONCILE_GRACE_SECONDS": "0",
        "JOBFENCE_ORPHAN_OBJECT_GRACE_SECONDS": "30", "JOBFENCE_ORPHAN_POD_GRACE_SECONDS": "30",
        # info: each worker's acknowledged claims and terminal writes, judged afterwards
        "JOBFENCE_LOG_FORMAT": "json", "JOBFENCE_LOG_LEVEL": "info",
        "JOBFENCE_TRIGGER": "scheduled", "JOBFENCE_S3_ENDPOINT_URL": s3,
        "JOBFENCE_S3_BUCKET": BUCKET, "AWS_ACCESS_KEY_ID": "chaos",
        "AWS_SECRET_ACCESS_KEY": "chaos"})
    return env


def sleep_action(lo: float, hi: float) -> dict[str, Any]:
    return {"name": "sleep", "params": {"seconds": round(random.uniform(lo, hi), 3)}}


def flaky_action(fail_percent: int) -> dict[str, Any]:
    script = (f"sleep 0.$(( $(od -An -N1 -tu1 /dev/urandom) % 3 )); "
              f"[ $(( $(od -An -N1 -tu1 /dev/urandom) % 100 )) -ge {fail_percent} ]")
    return {"name": "command", "params": {"argv": ["sh", "-c", script]}}


UPPER = ('for f in "$JOBFENCE_INPUT_DIR"/*; do sleep 0.1; tr a-z A-Z < "$f" > '
         '"$JOBFENCE_OUTPUT_DIR/$(basename "$f").out"; done')


def _sh(script: str) -> dict[str, Any]:
    return {"actions": [{"name": "command", "params": {"argv": ["sh", "-c", script]}}],
            "max_attempts": 4, "queue": "datums"}


WORKFLOW: dict[str, Any] = {"workflow": "handoff", "steps": {
    # three files; a datum over each (each writes one name: handed on under its datum's id);
    # the last step takes both steps' files
    "make": _sh('sleep 0.1; for i in 1 2 3; do echo "$i" > "$JOBFENCE_OUTPUT_DIR/f$i"; done'),
    "spread": {**_sh('sleep 0.1; cat "$JOBFENCE_INPUT_DIR"/make/* > "$JOBFENCE_OUTPUT_DIR/out"'),
               "inputs": {"steps": ["make"], "per_datum": 1}},
    "gather": {**_sh('find "$JOBFENCE_INPUT_DIR" -type f | sort > "$JOBFENCE_OUTPUT_DIR/ls"'),
               "inputs": {"steps": ["make", "spread"]}}}}
"""A workflow whose steps take the files of the steps before them (every file handed on must
be a committed one: chaos_checks.check_handed)."""
WORKFLOW_JOBS = 3 + 3  # its steps, and the datums of its fan-out


def on_resource_action(locks: Path, resource: str, lo: float, hi: float) -> dict[str, Any]:
    """A command that holds the resource's lock file for as long as any of its processes
    lives (flock: the kernel lets go when the last one dies) and writes its attempt as the
    holder; finding the lock taken, it writes `<its attempt> <the holder's>` to `overlaps`:
    two commands on one resource at once (judged by chaos_checks)."""
    seconds = round(random.uniform(lo, hi), 3)
    lock, holder = locks / f"{resource}.lock", locks / f"{resource}.holder"
    script = (f'flock -n -E 75 {lock} sh -c "echo \\$JOBFENCE_ATTEMPT_ID > {holder}; '
              f'sleep {seconds}"; [ $? -ne 75 ] || echo "$JOBFENCE_ATTEMPT_ID '
              f'$(cat {holder})" >> {locks / "overlaps"}')
    return {"name": "command", "params": {"argv": ["sh", "-c", script]}}


class Feeder(threading.Thread):
    """Enqueues the mix through the real enqueue path, until ``total`` jobs exist."""

    def __init__(self, settings: Settings, objects: S3ObjectStore, total: int,
                 counts: Counter[str], locks: Path) -> None:
        super().__init__(name="feeder", daemon=True)
        self.settings, self.objects, self.total, self.counts = settings, objects, total, counts
        self.locks = locks
        self.created = 0
        self.done = threading.Event()
        self.recent: list[str] = []
        self.datums = 0
        self.error: BaseException | None = None

    def _spec(self) -> dict[str, Any]:
        spec = self._kind()
        if "workflow" in spec:
            self.counts["queue: datums"] += 1  # its steps'
            return spec
        self.counts[f"queue: {spec.setdefault('queue', 'default')}"] += 1
        return spec

    def _kind(self) -> dict[str, Any]:
        r = random.random()
        if r < 0.2:
            self.counts["kind: plain"] += 1
            return {"actions": [sleep_action(0.02, 0.4)], "queue": "datums"}
        if r < 0.35:
            self.counts["kind: plain, on a queue limited to 2"] += 1
            return {"actions": [sleep_action(0.02, 0.4)], "queue": "limited"}
        if r < 0.55:
            self.counts["kind: exclusive resource"] += 1
            resource = random.choice(RESOURCES)
            return {"actions": [on_resource_action(self.locks, resource, 0.05, 0.8),
                                sleep_action(0, 0.2)],
                    "resource": resource}
        if r < 0.72:
            self.counts["kind: flaky, retried"] += 1
            return {"actions": [flaky_action(35)], "max_attempts": 4}
        if r < 0.78:
            self.counts["kind: run timeout"] += 1
            return {"actions": [sleep_action(1.5, 2.5)], "timeout": "PT1S", "max_attempts": 2}
        if r < 0.92 and self.recent:
            self.counts["kind: after a dependency"] += 1
            return {"actions": [sleep_action(0.02, 0.2)], "after": [random.choice(self.recent)]}
        if r < 0.945:
            self.counts["kind: workflow handing files on"] += 1
            return WORKFLOW
        if r < 0.975:
            self.counts["kind: datum parent"] += 1
            prefix = f"inputs/{self.datums}/"
            self.datums += 1
            for i in range(random.randint(3, 8)):
                self.objects.put_bytes(BUCKET, f"{prefix}part-{i}.txt", f"datum {i}\n".encode())
            return {"actions": [{"name": "command", "params": {"argv": ["sh", "-c", UPPER]}}],
                    "inputs": f"s3://{BUCKET}/{prefix}", "max_attempts": 4,
                    "queue": "datums"}
        self.counts["kind: plain"] += 1
        return {"actions": [sleep_action(0.02, 0.4)]}

    def run(self) -> None:
        try:
            self._feed()
        except BaseException as exc:
            self.error = exc  # judged: a run that enqueued less than it said is no pass
            raise

    def _feed(self) -> None:
        conn = None
        while self.created < self.total:
            spec = self._spec()
            try:
                if conn is None or conn.closed:
                    conn = connect(self.settings.database_url, application_name="chaos-feeder")
                if "workflow" in spec:
                    workflows.submit_workflow(self.settings, Store(conn),
                                              workflows.parse_workflow(spec), actor="chaos")
                    self.created += WORKFLOW_JOBS
                    continue
                [job] = submit(self.settings, Store(conn), parse_specs(spec),
                               objects=lambda: self.objects)
            except ResourceBusy:
                self.counts["enqueue refused: resource busy"] += 1
                time.sleep(0.01)
                continue
            except (StoreUnavailable, JobfenceError) as exc:
                if isinstance(exc, StoreUnavailable):
                    self.counts["enqueue retried: database unavailable"] += 1
                    conn = None
                    time.sleep(0.5)
                    continue
                raise
            self.created += 1 + (job.children or 0)
            self.recent = [*self.recent[-20:], str(job.job_id)]
            time.sleep(random.uniform(0, 0.01))
        if conn is not None:
            conn.close()
        self.done.set()


class Injector(threading.Thread):
    """Random faults every ``period`` seconds; PostgreSQL is restarted once, half-way."""

    def __init__(self, platform: LocalPlatform, pg: EmbeddedPostgres, dsn: str,
                 duration: float, period: float, faults: Counter[str]) -> None:
        super().__init__(name="injector", daemon=True)
        self.platform, self.pg, self.dsn = platform, pg, dsn
        self.duration, self.period, self.faults = duration, period, faults
        self.stop = threading.Event()
        self.paused: list[tuple[Proc, float]] = []
        self.killed: set[Path] = set()
        """The logs of the workers SIGKILLed: what they left unknown ended with them."""

    def run(self) -> None:
        started = time.monotonic()
        restarted = False
        kinds = [self._sigkill, self._sigterm, self._pause, self._terminate_backend,
                 self._cancel]
        first = random.sample(kinds, len(kinds))  # every kind at least once, then at random
        while not self.stop.wait(random.uniform(0.5, 1.5) * self.period):
            self._resume_due()
            if time.monotonic() - started > self.duration:
                break
            if not restarted and time.monotonic() - started > self.duration / 2:
                restarted = True
                self._restart_postgres()
                continue
            fault = first[-1] if first else random.choice([*kinds, self._sigkill,
                                                            self._terminate_backend])
            if fault() and first and fault is first[-1]:
                first.pop()  # applied: on to the next kind that has not happened yet
        self.resume_all()

    def _victim(self) -> Proc | None:
        paused = {p.popen.pid for p, _ in self.paused}
        live = [w for w in self.platform.live_workers() if w.popen.pid not in paused]
        return random.choice(live) if live else None

    def _signal(self, sig: int, name: str) -> Proc | None:
        w = self._victim()
        if w is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            w.popen.send_signal(sig)
            self.faults[name] += 1
            return w
        return None

    def _sigkill(self) -> bool:
        w = self._signal(signal.SIGKILL, "SIGKILL a worker")
        if w is not None:
            self.killed.add(w.log)
        return w is not None

    def _sigterm(self) -> bool:
        return self._signal(signal.SIGTERM, "SIGTERM a worker") is not None

    def _pause(self) -> bool:
        w = self._signal(signal.SIGSTOP, "SIGSTOP a worker past its lease, then SIGCONT")
        if w is not None:
            self.paused.append((w, time.monotonic() + LEASE + random.uniform(0.5, 2.5)))
        return w is not None

    def _resume_due(self) -> None:
        now = time.monotonic()
        for w, at in [p for p in self.paused if p[1] <= now]:
            with contextlib.suppress(ProcessLookupError):
                w.popen.send_signal(signal.SIGCONT)
        self.paused = [p for p in self.paused if p[1] > now]

    def resume_all(self) -> None:
        for w, _ in self.paused:
            with contextlib.suppress(ProcessLookupError):
                w.popen.send_signal(signal.SIGCONT)
        self.paused = []

    def _terminate_backend(self) -> bool:
        with contextlib.suppress(Exception), connect(self.dsn) as conn:
            rows = conn.execute("""
                SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
                WHERE application_name IN ('jobfence-worker', 'jobfence-heartbeat')
                ORDER BY random() LIMIT 1""").fetchall()
            if rows:
                self.faults["terminate a worker's database connection"] += 1
                return True
        return False

    def _cancel(self) -> bool:
        """Cancel a job, running ones first (its command must stop within a second, and no
        other run on its resource may start before it has)."""
        with contextlib.suppress(Exception), connect(self.dsn) as conn:
            row = conn.execute("SELECT job_id FROM jobs WHERE status IN ('pending', "
                               "'running') AND parent_id IS NULL ORDER BY status = "
                               "'running' DESC, resource IS NOT NULL DESC, random() "
                               "LIMIT 1").fetchone()
            if row:
                Store(conn).jobs.cancel(job_id=row["job_id"], reason="cancelled by chaos")
                self.faults["cancel a job (operator)"] += 1
                return True
        return False

    def _restart_postgres(self) -> None:
        self.pg.restart(down_seconds=2.0)
        self.faults["restart PostgreSQL (crash stop, 2 s down)"] += 1


def wait_drained(dsn: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception), connect(dsn) as conn:
            row = conn.execute("SELECT count(*) AS n FROM jobs WHERE status = ANY(%s)",
                               (list(ACTIVE),)).fetchone()
            if row and row["n"] == 0:
                return True
        time.sleep(1.0)
    return False


def table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(a) for a, _ in rows) + 2
    print(f"\n{title}")
    for a, b in rows:
        print(f"  {a:<{width}}{b}")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=3000, help="jobs to enqueue (children count)")
    p.add_argument("--workers", type=int, default=6, help="most worker processes at once in the default and datums pools (the "
                        "limited pool adds at most 2: its trigger is capped at the limit)")
    p.add_argument("--fault-period", type=float, default=1.0, help="seconds between faults")
    p.add_argument("--drain-timeout", type=float, default=None,
                   help="seconds the queue may take to drain after the faults (default: "
                        "300, or half a second a job: the one-job-per-pod pool starts a "
                        "process a job, a few a second on two cores)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="shorter fault phase (make test)")
    p.add_argument("--pgbouncer", action="store_true",
                   help="every jobfence process reaches PostgreSQL through a PgBouncer in "
                        "transaction mode (pool of 20 server connections)")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    started = time.monotonic()
    faults: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    with contextlib.ExitStack() as stack:
        # Durable (fsync, synchronous commit): a crash stop must not lose an acknowledged
        # commit, or checks read from the database could not see one lost.
        pg = stack.enter_context(EmbeddedPostgres(durable=True))
        s3 = stack.enter_context(moto_server())
        work = Path(tempfile.mkdtemp(prefix="jobfence-chaos-"))  # kept when the run fails
        locks = work / "resources"  # the resource jobs' lock files: every job's user writes
        locks.mkdir(mode=0o777)
        locks.chmod(0o1777)
        for name in (*(f"{r}.lock" for r in RESOURCES), *(f"{r}.holder" for r in RESOURCES),
                     "overlaps"):
            (locks / name).touch()
            (locks / name).chmod(0o666)
        conn = connect(pg.dsn)
        migrate(conn)
        conn.close()
        route, pooler = pg.dsn, "none"
        if args.pgbouncer:
            bouncer = stack.enter_context(PgBouncer(pg.dsn, pool_mode="transaction",
                                                    default_pool_size=20))
            route, pooler = bouncer.url("postgres"), "transaction"
        env = chaos_env(route, s3, pooler)
        objects = S3ObjectStore(endpoint_url=s3)
        objects.client.create_bucket(Bucket=BUCKET)
        settings = Settings(database_url=route, database_pooler=pooler, s3_bucket=BUCKET,
                            s3_endpoint_url=s3)
        with connect(pg.dsn) as conn:
            Store(conn).queues.configure("limited", limit=LIMIT, set_limit=True)
        schedule = {f: every for f, every in SCHEDULE.items() if f in COMMANDS}
        platform = LocalPlatform(pg.dsn, env, work / "logs", schedules=schedule,
                                 poll_seconds=0.3, pools=pools(args.workers))
        stack.callback(platform.stop)
        feeder = Feeder(settings, objects, args.jobs, kinds, locks)
        print(f"chaos: seed {seed}, {args.jobs} jobs, up to {args.workers + LIMIT} workers, "
              f"PostgreSQL on 127.0.0.1:{pg.port}"
              f"{' through PgBouncer (transaction mode)' if args.pgbouncer else ''}, "
              f"S3 on {s3}", flush=True)
        print("chaos: jobs at once per worker: " + ", ".join(
            f"{p.name} {p.concurrency}" for p in pools(args.workers)), flush=True)
        platform.start()
        feeder.start()
        # Faults for as long as the work keeps coming in, and a little after.
        duration = 20.0 if args.quick else max(60.0, args.jobs / 25)
        injector = Injector(platform, pg, pg.dsn, duration, args.fault_period, faults)
        injector.start()
        feeder.join()
        injector.join()
        print(f"chaos: {feeder.created} jobs enqueued, faults done after "
              f"{time.monotonic() - started:.0f}s; draining", flush=True)
        platform.schedules = {f: every * DRAIN_PACE for f, every in schedule.items()}
        drained = wait_drained(pg.dsn, args.drain_timeout or max(300.0, args.jobs / 2))
        # Workers end on their own (nothing ready, or their time is up), each once it has
        # settled what it still had open; one still running after that is killed, and what
        # it left is the lease's to decide, as after any SIGKILL.
        injector.killed.update(p.log for p in platform.stop(kill_workers=False,
                                                            grace=30 + 4 * LEASE))
        with connect(pg.dsn) as conn:
            verdicts = check_database(conn)
            verdicts.append(check_manifests(conn, lambda: objects))
            verdicts.append(check_handed(conn))
            verdicts.append(check_overlaps(conn, locks / "overlaps"))
            # what each worker was acknowledged (its log), against what the database kept
            verdicts.extend(check_acks(conn, acked_events(
                sorted((work / "logs").glob("*-worker-*.log")), injector.killed)))
            if not drained:
                verdicts.append(Verdict("the queue drained within the timeout", ["timeout"]))
            if feeder.error is not None:
                verdicts.append(Verdict("every job of the mix was enqueued",
                                        [{"feeder": repr(feeder.error)[:500]}]))
            totals = conn.execute("SELECT status, count(*) AS n FROM jobs GROUP BY status "
                                  "ORDER BY status").fetchall()
            claims = conn.execute("SELECT count(*) AS n FROM job_events "
                                  "WHERE to_status = 'running' AND attempt_id IS NOT NULL"
                                  ).fetchone()
        table("jobs by kind", sorted((k, str(v)) for k, v in kinds.items()))
        table("faults injected", sorted((k, str(v)) for k, v in faults.items()))
        table("processes", sorted((k, str(v)) for k, v in platform.exits.items()))
        table("outcome", [(r["status"], str(r["n"])) for r in totals]
              + [("claims (attempts started)", str(claims["n"] if claims else 0))])
        table("invariants (from the audit trail, the object store and what workers were acked)",
              [(v.name, (f"ok ({v.checked} looked at)" if v.checked else "ok") if v.ok
                else f"VIOLATED: {json.dumps(v.violations, default=str)}")
               for v in verdicts])
        bad = [v for v in verdicts if not v.ok]
        print(f"\nchaos: {'FAILED' if bad else 'passed'} in {time.monotonic() - started:.0f}s "
              f"(seed {seed}; reproduce the mix with --seed {seed})")
        if bad:
            print(f"chaos: logs kept in {work}/logs", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
