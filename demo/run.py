"""`make demo`: the whole story on one machine, no cluster and no cloud.

A throwaway PostgreSQL (or $JOBFENCE_DATABASE_URL), moto's S3 server on 127.0.0.1, and the
`local` platform standing in for KEDA and for the CronJobs (every periodic function on a
compressed schedule). KEDA runs the two pools manifests/pools.yaml ships, each from its own
trigger query: `default` (table maintenance, one job per pod) and `datums` (short work,
draining pods). A realistic mix — table maintenance on exclusive resources, a dependency, a
flaky job, a scheduled job, a datum job from S3 inputs held in its paused queue — while one
worker is SIGKILLed (reconciliation recovers its job in seconds) and one is paused past its
lease (the sweeper recovers it; the fence rejects its late write). Then the datums queue is
resumed and a few draining pods run all its work; then a workflow of twelve steps, one of
them a fan-out of 120 datums (examples/etl-workflow), runs to its end. Ends with a summary
table, and cleans up after itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from uuid import UUID

from devtools import REPO
from devtools.platform import JOBFENCE, LocalPlatform, Proc
from devtools.roles import ensure_logins, url_of
from devtools.s3 import moto_server
from devtools.sqlconn import connect
from jobfence.functions.cli import COMMANDS
from jobfence.pools import Pool, Pools
from jobfence.store import Store

TTY = sys.stdout.isatty()
BOLD, DIM, RED, GREEN, YELLOW, RESET = (
    ("\033[1m", "\033[2m", "\033[31m", "\033[32m", "\033[33m", "\033[0m") if TTY
    else ("",) * 6)
LEASE = 8
# Short leases and a compressed schedule so the story fits in a minute; production runs a
# 120 s lease, the sweeper every minute and reconciliation every two.
DEMO_ENV = {"JOBFENCE_LEASE_SECONDS": str(LEASE), "JOBFENCE_HEARTBEAT_SECONDS": "1",
            "JOBFENCE_RETRY_BASE_SECONDS": "0.5", "JOBFENCE_LOG_FORMAT": "json",
            "JOBFENCE_RECONCILE_GRACE_SECONDS": "0", "JOBFENCE_ORPHAN_OBJECT_GRACE_SECONDS": "0",
            "JOBFENCE_TRIGGER": "scheduled", "AWS_ACCESS_KEY_ID": "demo",
            "AWS_SECRET_ACCESS_KEY": "demo",
            # The story's commands keep their state in the demo's own (private) directory:
            # they run as the worker's user, not as another one (docs/REFERENCE.md, "A
            # job's code and the keys").
            "JOBFENCE_COMMAND_USER": "worker"}
SCHEDULE = {"sweeper": 2.0, "reconciliation": 2.0, "export-finalize": 2.0,
            "lifecycle": 5.0, "orphan-cleanup": 5.0, "schedules": 5.0}
BUCKET = "jobfence-demo"
DATUMS = 12
WORKFLOW_DATUMS = 120
# The pools the manifests ship, sized for one machine.
POOL_SIZES = {"default": 4, "datums": 3}


def shipped_pools() -> tuple[Pool, ...]:
    import yaml

    pools = Pools.model_validate(yaml.safe_load((REPO / "manifests" / "pools.yaml").read_text()))
    return tuple(p.model_copy(update={"max_pods": POOL_SIZES.get(p.name, 2)})
                 for p in pools.pools)


class Demo:
    def __init__(self, dsn: str, s3: str, work: Path) -> None:
        self.dsn, self.work = dsn, work
        self.env = {**os.environ, **DEMO_ENV, "JOBFENCE_DATABASE_URL": dsn,
                    "JOBFENCE_S3_ENDPOINT_URL": s3, "JOBFENCE_S3_BUCKET": BUCKET,
                    }
        self.conn = connect(dsn)
        self.store = Store(self.conn)
        self.role_urls: dict[str, str] = {}
        self.console: subprocess.Popen[bytes] | None = None
        self.console_url = ""
        """Each role's login URL once the roles exist: every command connects as its
        function's role (jobfence.store.roles), as a deployment's pods do."""
        self.t0 = time.monotonic()

    def step(self, title: str) -> None:
        print(f"\n{BOLD}== {title}{RESET}  {DIM}(t+{time.monotonic() - self.t0:.0f}s){RESET}")

    def say(self, text: str) -> None:
        print(f"   {text}")

    def cli(self, *args: str, expect: int = 0, show: bool = True,
            stdin: str | None = None) -> str:
        if show:
            print(f"{DIM}$ jobfence {' '.join(args)}{RESET}")
        env = {**self.env, "JOBFENCE_DATABASE_URL": url_of(self.role_urls, args[0], self.dsn)}
        r = subprocess.run([*JOBFENCE, *args], env=env, cwd=REPO, input=stdin,
                           capture_output=True, text=True, check=False)
        if show and r.stdout.strip():
            print("\n".join("   " + ln for ln in r.stdout.strip().splitlines()))
        if r.returncode != 0 and show:
            msg = [ln for ln in r.stderr.splitlines() if ln.startswith("jobfence:")]
            print(f"   -> exit {r.returncode}: {msg[-1] if msg else ''}")
        if r.returncode != expect:
            raise SystemExit(f"demo: `jobfence {' '.join(args)}` exited {r.returncode}, "
                             f"expected {expect}\n{r.stderr[-2000:]}")
        return r.stdout

    def enqueue(self, *args: str) -> str:
        return str(json.loads(self.cli("enqueue", *args, show=False))["job_id"])

    def job(self, job_id: str) -> dict[str, Any]:
        row = self.store.jobs.get(UUID(job_id))
        assert row is not None
        return row._asdict()

    def workflow(self, workflow_id: str) -> dict[str, Any]:
        from jobfence import workflows

        return workflows.workflow_view(*workflows.get(self.store, UUID(workflow_id)))

    def taken_back(self, job_id: str) -> str:
        """Why the job's first claim was taken away, from the audit trail (the row's own
        reason is gone once another worker claims the job again)."""
        row = self.conn.execute("""
            SELECT reason FROM job_events
            WHERE job_id = %s AND from_status = 'running' AND to_status IN ('pending', 'failed')
            ORDER BY event_id LIMIT 1""", (job_id,)).fetchone()
        return str(row["reason"]) if row and row["reason"] else "reclaimed"

    def claims_per_worker(self, parent: str) -> list[int]:
        """How many of a parent's children each worker claimed, from the audit trail."""
        rows = self.conn.execute("""
            SELECT e.reason, count(*) AS n FROM job_events e
            JOIN jobs j ON j.job_id = e.job_id
            WHERE j.parent_id = %s AND e.to_status = 'running' AND e.attempt_id IS NOT NULL
            GROUP BY e.reason ORDER BY n DESC""", (parent,)).fetchall()
        return [int(r["n"]) for r in rows]

    def wait_until(self, what: str, fn: Callable[[], object], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not fn():
            if time.monotonic() > deadline:
                rows = self.conn.execute("SELECT job_id, status, attempt_count, reason "
                                         "FROM jobs WHERE status NOT IN ('succeeded') "
                                         "ORDER BY job_id").fetchall()
                raise SystemExit(f"demo: timed out waiting for {what}; not succeeded: "
                                 + "; ".join(f"{r['job_id']} {r['status']} "
                                             f"{r['attempt_count']} {r['reason']}"
                                             for r in rows))
            time.sleep(0.1)


def first_attempt_long(work: Path, name: str, seconds: int, echo: str) -> str:
    """A command that runs `seconds` on its first attempt, and quickly on a retry."""
    mark = work / f"{name}.started"
    script = (f'echo "{echo}"; if [ -e {mark} ]; then sleep 0.3; exit 0; fi; '
              f"touch {mark}; exec sleep {seconds}")
    return "command:" + json.dumps({"argv": ["sh", "-c", script]})


def worker_of(platform: LocalPlatform, claimed_by: str) -> Proc:
    pid = int(claimed_by.rsplit(":", 1)[1])
    [proc] = [w for w in platform.live_workers() if w.popen.pid == pid]
    return proc


def free_port(preferred: int = 8080) -> int:
    import socket

    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError("no free port on 127.0.0.1")


def start_console(d: Demo) -> subprocess.Popen[bytes]:
    """`jobfence serve` on 127.0.0.1, writing as the operator's login and reading as the
    reader's; its manual triggers start the periodic functions as processes with the
    maintainer's."""
    port = int(os.environ.get("DEMO_CONSOLE_PORT") or free_port())
    env = {**d.env, "JOBFENCE_DATABASE_URL": url_of(d.role_urls, "serve", d.dsn),
           "JOBFENCE_READER_DATABASE_URL": url_of(d.role_urls, "status", d.dsn),
           "JOBFENCE_AUTH": "none", "JOBFENCE_CLUSTER": "local",
           "JOBFENCE_LOCAL_FUNCTIONS_DATABASE_URL": url_of(d.role_urls, "sweeper", d.dsn),
           "JOBFENCE_TRIGGER": "auto"}
    log = open(d.work / "console.log", "ab")  # noqa: SIM115 - the process keeps it
    proc = subprocess.Popen([*JOBFENCE, "serve", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, cwd=REPO, stdout=log, stderr=log)
    d.console_url = f"http://127.0.0.1:{port}/"
    d.wait_until("the console answers", lambda: console_get(d, "/healthz"), timeout=30)
    return proc


def console_get(d: Demo, path: str) -> Any:
    import urllib.request

    try:
        url = d.console_url.rstrip("/") + path  # always http://127.0.0.1
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310
            return json.loads(resp.read())
    except OSError:
        return None


def story(d: Demo, platform: LocalPlatform) -> int:
    d.step("1. schema and roles: migrations under an advisory lock (twice is harmless)")
    d.cli("migrate")
    d.cli("migrate", show=False)
    d.role_urls = platform.role_urls = ensure_logins(d.dsn)
    d.say("from here on every command connects as a login of its function's role: "
          "workers as jobfence_worker (fenced functions only, no table), periodic "
          "functions as jobfence_maintainer, enqueue/cancel/queue as jobfence_operator, "
          "list/status and KEDA's query as jobfence_reader")

    d.console = start_console(d)
    d.say(f"the console: {BOLD}{d.console_url}{RESET}  (open it to watch the story; "
          "JOBFENCE_AUTH=none, on 127.0.0.1 only)")

    d.step(f"2. {DATUMS} input files on S3 (moto, 127.0.0.1), then enqueue a realistic mix")
    from jobfence.adapters.s3 import S3ObjectStore

    s3 = S3ObjectStore(endpoint_url=d.env["JOBFENCE_S3_ENDPOINT_URL"])
    s3.client.create_bucket(Bucket=BUCKET)
    for i in range(DATUMS):
        s3.put_bytes(BUCKET, f"inputs/day=2026-11-22/part-{i:03d}.txt", f"row {i}\n".encode())
    orders = d.enqueue(first_attempt_long(d.work, "orders", 60, "compacting db.orders"),
                       "--resource", "db.orders", "--priority", "9")
    users = d.enqueue(first_attempt_long(d.work, "users", 60, "compacting db.users"),
                      "--resource", "db.users", "--priority", "8")
    events = d.enqueue('command:{"argv": ["sh", "-c", "echo compacting db.events; sleep 1"]}',
                       "--resource", "db.events")
    expiry = d.enqueue('command:{"argv": ["echo", "expiring snapshots of db.events"]}',
                       "--after", events, "--resource", "db.events.snapshots")
    flaky_script = (f"test -e {d.work}/flaky || {{ touch {d.work}/flaky; "
                    "echo 'metastore timeout' >&2; exit 1; }")
    flaky = d.enqueue("command:" + json.dumps({"argv": ["sh", "-c", flaky_script]}),
                      "--resource", "db.clicks")
    d.cli("enqueue", 'sleep:{"seconds": 1}', "--resource", "db.events", expect=3)
    d.say("a second job on db.events is refused by the database's unique index (exit 3)")
    report = d.enqueue('command:{"argv": ["echo", "rebuilding the clicks report"]}',
                       "--delay", "PT8S")
    d.say("the clicks report is scheduled: not claimed, nor counted by KEDA, for 8 s")
    d.cli("list")
    d.cli("queue", "pause", "datums", "--reason", "the export's target is being migrated")
    upper = ('for f in "$JOBFENCE_INPUT_DIR"/*; do tr a-z A-Z < "$f" > '
             '"$JOBFENCE_OUTPUT_DIR/$(basename "$f" .txt).out"; done')
    spec = {"actions": [{"name": "command", "params": {"argv": ["sh", "-c", upper]}}],
            "inputs": f"s3://{BUCKET}/inputs/day=2026-11-22/", "labels": {"kind": "export"},
            "queue": "datums"}
    datum = json.loads(d.cli("enqueue", "--spec", "-", stdin=json.dumps(spec), show=False))
    parent = str(datum["job_id"])
    d.say(f"datum job {parent[:8]}… in the paused queue `datums`: {datum['children']} "
          "children, one per input file, all held")

    d.step("3. the local platform starts: each pool's KEDA query spawns its workers, "
           "CronJobs tick")
    platform.start()
    d.wait_until("db.orders and db.users to be claimed", lambda: all(
        d.job(j)["status"] == "running" for j in (orders, users)))
    d.say(f"KEDA stand-in: default pool's query = {d.store.queues.scaler_value('default')} "
          f"(ready + claimed), {len(platform.live_workers('default'))} one-job workers; "
          f"datums pool's query = {d.store.queues.scaler_value('datums')} (paused), "
          f"{len(platform.live_workers('datums'))} workers")
    d.cli("queue", "status")
    time.sleep(1.0)
    killed = worker_of(platform, d.job(orders)["claimed_by"])
    killed.popen.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    killed.popen.wait(timeout=10)  # reaped at once: the pod is gone, not lingering as Failed
    d.say(f"{RED}SIGKILL{RESET} {killed.name} (pid {killed.popen.pid}) mid-way through the "
          "db.orders compaction: an OOM kill, a lost node")
    paused = worker_of(platform, d.job(users)["claimed_by"])
    paused_attempt = d.job(users)["attempt_id"]
    paused.popen.send_signal(signal.SIGSTOP)
    d.say(f"{RED}SIGSTOP{RESET} {paused.name} (pid {paused.popen.pid}) mid-way through the "
          "db.users compaction: a long GC pause, a frozen VM")

    d.step("4. reconciliation notices the worker's pod died: no waiting for the lease")
    d.wait_until("db.orders to be reclaimed", lambda: d.job(orders)["status"] != "running"
                 or d.job(orders)["attempt_count"] > 1)
    back = time.monotonic() - killed_at
    d.say(f"db.orders back to pending {back:.1f} s after the kill: "
          f"\"{d.taken_back(orders)}\" (its lease had {LEASE} s to run)")

    d.step("5. the paused worker still looks alive, so its lease runs out; the sweeper "
           "rotates the fence")
    d.wait_until("db.users to be reclaimed", lambda: d.job(users)["attempt_count"] > 1
                 or d.job(users)["status"] == "pending", timeout=LEASE * 4)
    d.say(f"db.users: \"{d.taken_back(users)}\"")

    d.step("6. the paused worker wakes up (SIGCONT): its lease is gone, it writes nothing")
    paused.popen.send_signal(signal.SIGCONT)
    paused.popen.wait(timeout=30)
    for line in paused.log.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") in ("self_fenced", "writeback_stale_attempt"):
            d.say(f"{GREEN}{paused.name} log:{RESET} {event['event']}: {event.get('message')}")
    d.say(f"{paused.name} exited {paused.popen.returncode}; its pod no longer holds a KEDA "
          "slot (a pod that never wakes is deleted by orphan-cleanup after its grace period)")
    d.wait_until("db.users to be finished by another worker",
                 lambda: d.job(users)["status"] == "succeeded", timeout=60)
    d.say("a new worker ran db.users again and finished it")
    late = d.store.attempts.finish(job_id=UUID(users), attempt_id=paused_attempt, succeeded=True)
    d.say(f"the 'succeeded' it would have written, replayed by hand with its old attempt_id: "
          f"{GREEN}{'matched no row' if late is None else 'ACCEPTED?!'}{RESET} — the fence")

    d.wait_until("the default queue to drain", lambda: all(
        d.job(j)["status"] in ("succeeded", "failed", "cancelled")
        for j in (orders, users, events, expiry, flaky, report)), timeout=90)
    held = d.store.queues.status("datums")[0]
    d.say(f"the default queue drained; `datums` still holds {held.pending} ready jobs, "
          f"paused, with {len(platform.live_workers('datums'))} workers")

    d.step("7. resume `datums`: a few draining pods run every child; the worker that runs "
           "the last one finalizes the datum job")
    d.cli("queue", "resume", "datums")
    d.wait_until("the datum job to finish", lambda: d.job(parent)["status"] in (
        "succeeded", "failed", "cancelled"), timeout=90)
    per_worker = d.claims_per_worker(parent)
    d.say(f"{len(per_worker)} draining workers ran the {DATUMS} children: "
          + ", ".join(f"{n} jobs" for n in per_worker)
          + f" (each start-up paid once; {platform.workers_started['default']} one-job "
          "pods ran the maintenance work)")
    p = d.job(parent)
    bucket, key = p["manifest"].removeprefix("s3://").split("/", 1)
    manifest = json.loads(s3.get_bytes(bucket, key))
    outputs = [u for item in manifest["items"] for u in item["outputs"]]
    sample = s3.get_bytes(*outputs[0].removeprefix("s3://").split("/", 1)).decode().strip()
    d.say(f"parent {p['status']}: {manifest['children']}; manifest {p['manifest']}")
    row = d.store.jobs.get(UUID(parent))
    last = max(c.finished_at for c in d.store.jobs.page(parent_id=UUID(parent), limit=DATUMS)
               if c.finished_at is not None)
    if row is not None and row.finished_at is not None:
        d.say(f"finalized {(row.finished_at - last).total_seconds():.2f} s after its last "
              "child, by the worker that ran it (export-finalize is the safety net)")
    d.say(f"{len(outputs)} committed outputs, e.g. {outputs[0].rsplit('/', 1)[1]} = {sample!r}")

    d.step(f"8. a workflow of twelve steps, one a fan-out of {WORKFLOW_DATUMS} datums: "
           "examples/etl-workflow/workflow.yaml")
    for i in range(WORKFLOW_DATUMS):
        s3.put_bytes(BUCKET, f"lake/day=2026-11-22/part-{i:03d}.txt", f"row {i}\n".encode())
    etl = str(REPO / "examples" / "etl-workflow" / "workflow.yaml")
    made = json.loads(d.cli("enqueue", "--spec", etl, show=False))
    workflow_id = made["workflow_id"]
    d.say(f"workflow {workflow_id[:8]}… submitted whole, in one transaction: "
          + ", ".join(f"{k} {v['status']}" for k, v in list(made["steps"].items())[:4])
          + ", …")
    d.wait_until("the workflow to finish", lambda: d.workflow(workflow_id)["finished_at"],
                 timeout=180)
    d.cli("workflow", "status", workflow_id)
    [report_url] = [r["url"] for r in d.store.conn.execute(
        "SELECT o.url FROM jobfence.job_outputs o WHERE o.job_id = %s AND o.status = 'done'",
        (UUID(made["steps"]["report"]["job_id"]),))]
    lines = s3.get_bytes(*report_url.removeprefix("s3://").split("/", 1)).decode().split("\n")
    d.say("each load took the transform's datums' files, the report took each load's: "
          f"report.txt says {lines[0]!r}, … ({len([x for x in lines if x])} loads)")
    again = json.loads(d.cli("enqueue", "--spec", etl, show=False))
    d.say(f"submitted again with its key: the same workflow ({again['workflow_id'][:8]}…, "
          f"created {again.get('created', True)}), nothing run twice")
    time.sleep(SCHEDULE["orphan-cleanup"] + 1)  # one more orphan-cleanup tick
    platform.stop()

    return summary(d, platform, [
        ("db.orders", orders, f"{killed.name} SIGKILLed → reconciliation"),
        ("db.users", users, f"{paused.name} paused → sweeper; late write fenced"),
        ("db.events", events, ""), ("db.events.snapshots", expiry, "after db.events"),
        ("db.clicks", flaky, "failed once, retried with backoff"),
        ("clicks report", report, "scheduled: not before its delay"),
        (f"export ({DATUMS} datums)", parent, "held while paused; finalized once"),
        ("nightly-etl: report", made["steps"]["report"]["job_id"],
         f"the last of 12 steps; {WORKFLOW_DATUMS} datums before it")])


def summary(d: Demo, platform: LocalPlatform, rows: list[tuple[str, str, str]]) -> int:
    d.step("9. what happened, from the audit trail")
    print(f"   {'JOB':<22}{'STATUS':<11}{'ATTEMPTS':<10}{'CLAIMED BY (audit)':<44}NOTE")
    ok = True
    for what, job_id, note in rows:
        j = d.job(job_id)
        evs = d.store.jobs.events(UUID(job_id))
        claims = [(e.reason or "").removeprefix("claimed by ").split(":")[-1] for e in evs
                  if e.to_status == "running" and (e.reason or "").startswith("claimed by")]
        terminal = [e for e in evs if e.to_status in ("succeeded", "failed", "cancelled")]
        ok &= j["status"] == "succeeded" and len(terminal) == 1
        colour = GREEN if j["status"] == "succeeded" else RED
        chain = " → ".join(f"pid {c}" for c in claims) if claims else "(its children)"
        attempts = "—" if j["is_parent"] else f"{j['attempt_count']}/{j['max_attempts']}"
        print(f"   {what:<22}{colour}{j['status']:<11}{RESET}{attempts:<10}{chain:<44}{note}")
    flaky = next(job_id for what, job_id, _ in rows if what == "db.clicks")
    print()
    d.cli("logs", flaky, "--attempt", "1")
    d.say("what each attempt wrote stays readable: tails in the database, a longer output "
          "whole on S3 (`--follow` while it runs)")
    export = next(job_id for what, job_id, _ in rows if what.startswith("export"))
    children = d.store.jobs.children_counts(UUID(export))
    print(f"\n   children of the datum job: {children}")
    running = d.conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'running' "
                             "AND NOT is_parent").fetchone()
    twice = d.conn.execute("""SELECT count(*) AS n FROM (SELECT job_id FROM job_events
        WHERE to_status IN ('succeeded', 'failed', 'cancelled') GROUP BY job_id
        HAVING count(*) > 1) t""").fetchone()
    ok &= running is not None and running["n"] == 0 and twice is not None and twice["n"] == 0
    print(f"\n   {'FUNCTION':<18}{'RUNS':<7}{'LAST':<11}WHAT IT DID (totals)")
    totals: dict[str, dict[str, float]] = {}
    for t in d.store.runs.function_totals():
        totals.setdefault(t.function, {})[t.item] = float(t.total)
    interesting = ("reclaimed", "missing_pods_detected", "status_drift_detected",
                   "parents_succeeded", "dependents_released", "orphaned_objects_deleted",
                   "finished_pods_deleted", "retention_jobs_deleted", "expired_cancelled")
    for s in d.store.runs.function_status():
        name = s.function
        counts = ", ".join(f"{k} {v:g}" for k, v in totals.get(name, {}).items()
                           if k in interesting and v)
        runs = sum(v for k, v in totals.get(name, {}).items() if k.startswith("run:"))
        print(f"   {name:<18}{runs:<7g}{s.last_status:<11}{counts or '—'}")
    # The operator's view: what Prometheus reads, folded from the audit trail by the passes.
    d.cli("sweeper", show=False)  # one more pass folds the last transitions
    from prometheus_client.parser import text_string_to_metric_families

    finished: dict[str, dict[str, float]] = {}
    outcomes: dict[str, float] = {}
    for family in text_string_to_metric_families(d.cli("metrics", show=False)):
        for sample in family.samples:
            if sample.name == "jobfence_jobs_finished_total":
                finished.setdefault(sample.labels["queue"], {})[sample.labels["status"]] = \
                    sample.value
            elif sample.name == "jobfence_job_attempts_total":
                outcome = sample.labels["outcome"]
                outcomes[outcome] = outcomes.get(outcome, 0) + sample.value
    terminal = d.conn.execute("SELECT count(*) AS n FROM job_events WHERE to_status IN "
                              "('succeeded', 'failed', 'cancelled')").fetchone()
    ok &= terminal is not None and sum(v for q in finished.values() for v in q.values()) \
        == terminal["n"]
    print("\n   from `jobfence metrics` (what Prometheus reads, folded from the audit trail):")
    for queue, by_status in sorted(finished.items()):
        print(f"   jobs finished in {queue}: " + ", ".join(
            f"{k} {v:g}" for k, v in sorted(by_status.items())))
    print("   attempts by outcome: " + ", ".join(f"{k} {v:g}" for k, v in sorted(
        outcomes.items())))
    exits = ", ".join(f"{k}: {v}" for k, v in sorted(platform.exits.items()) if "worker" in k)
    started = ", ".join(f"{pool} {n}" for pool, n in sorted(platform.workers_started.items()))
    print(f"\n   workers started by the KEDA stand-in: {started} ({exits})")
    print(f"   jobs still running: {running['n'] if running else '?'}; "
          f"jobs with two terminal writes: {twice['n'] if twice else '?'}")
    verdict = (f"{GREEN}every job finished exactly once; nothing lost, nothing stuck{RESET}"
               if ok else f"{RED}SOMETHING WENT WRONG{RESET}")
    if d.console is not None:
        queues = (console_get(d, "/api/v1/queues") or {}).get("queues", [])
        page = (console_get(d, "/api/v1/jobs?limit=500") or {}).get("jobs", [])
        print(f"\n   the console at {d.console_url} served {len(queues)} queues and "
              f"{len(page)} jobs through its API (docs/CONSOLE.md)")
    print(f"\n{BOLD}{verdict}.{RESET} Next: `make test`, `jobfence --help`, manifests/.")
    return 0 if ok else 1


def stop_console(d: Demo) -> None:
    if d.console is not None and d.console.poll() is None:
        d.console.send_signal(signal.SIGTERM)
        try:
            d.console.wait(timeout=20)
        except subprocess.TimeoutExpired:
            d.console.kill()
            d.console.wait()


def main() -> int:
    started = time.monotonic()
    with ExitStack() as stack:
        dsn = os.environ.get("JOBFENCE_DATABASE_URL")
        if not dsn:
            from devtools.embedded_pg import EmbeddedPostgres

            pg = stack.enter_context(EmbeddedPostgres())
            dsn = pg.dsn
            print(f"embedded PostgreSQL on 127.0.0.1:{pg.port} (deleted at exit)")
        s3 = stack.enter_context(moto_server())
        print(f"moto S3 server on {s3} (in memory, gone at exit)")
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jobfence-demo-")))
        demo = Demo(dsn, s3, work)
        stack.callback(demo.conn.close)
        schedule = {f: every for f, every in SCHEDULE.items() if f in COMMANDS}
        platform = LocalPlatform(dsn, demo.env, work / "logs", schedules=schedule,
                                 pools=shipped_pools())
        stack.callback(platform.stop)
        stack.callback(stop_console, demo)
        code = story(demo, platform)
        if demo.console is not None and sys.stdin.isatty() and TTY:
            input(f"\n   the console stays up at {demo.console_url} — press Enter to end "
                  "the demo ")
    print(f"{DIM}demo took {time.monotonic() - started:.0f}s{RESET}")
    return code


if __name__ == "__main__":
    sys.exit(main())
