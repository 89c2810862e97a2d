"""`make demo`: the main story on embedded defaults, in under a minute.

A throwaway PostgreSQL (or $JOBFENCE_DATABASE_URL), the real `jobfence` CLI, worker
processes — one SIGKILLed mid-job, one paused past its lease — the sweeper bringing their
jobs back, and the fence rejecting the paused worker's late write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TTY = sys.stdout.isatty()
BOLD, DIM, RED, GREEN, RESET = (("\033[1m", "\033[2m", "\033[31m", "\033[32m", "\033[0m")
                                if TTY else ("",) * 5)
# Short leases so the story fits in a minute; production defaults are 120 s / 30 s.
DEMO_ENV = {"JOBFENCE_LEASE_SECONDS": "3", "JOBFENCE_HEARTBEAT_SECONDS": "0.5",
            "JOBFENCE_RETRY_BASE_SECONDS": "0.5", "JOBFENCE_LOG_FORMAT": "json"}


class Demo:
    def __init__(self, dsn: str, work: Path) -> None:
        self.work = work
        self.env = {**os.environ, **DEMO_ENV, "JOBFENCE_DATABASE_URL": dsn,
                    "PYTHONPATH": str(REPO)}
        self.procs: list[subprocess.Popen[str]] = []

    def step(self, title: str) -> None:
        print(f"\n{BOLD}== {title}{RESET}")

    def say(self, text: str) -> None:
        print(f"   {text}")

    def cli(self, *args: str, expect: int = 0, show: bool = True) -> str:
        if show:
            print(f"{DIM}$ jobfence {' '.join(args)}{RESET}")
        r = subprocess.run([sys.executable, "-m", "functions.cli", *args], env=self.env,
                           cwd=REPO, capture_output=True, text=True, check=False)
        if show and r.stdout.strip():
            print(r.stdout.strip())
        if r.returncode != 0 and show:
            msg = [ln for ln in r.stderr.splitlines() if ln.startswith("jobfence:")]
            print(f"   -> exit {r.returncode}: {msg[-1] if msg else ''}")
        if r.returncode != expect:
            raise SystemExit(f"demo: `jobfence {' '.join(args)}` exited {r.returncode}, "
                             f"expected {expect}\n{r.stderr[-2000:]}")
        return r.stdout

    def enqueue(self, *args: str) -> str:
        return str(json.loads(self.cli("enqueue", *args, show=False))["job_id"])

    def worker(self, name: str, max_jobs: int = 1) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-m", "functions.cli", "worker",
                              "--max-jobs", str(max_jobs)],
                             env={**self.env, "JOBFENCE_WORKER_ID": name}, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def job(self, job_id: str) -> dict[str, Any]:
        out = self.cli("status", job_id, "-o", "json", "--events", show=False)
        return dict(json.loads(out))

    def wait_until(self, what: str, fn: Any, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not fn():
            if time.monotonic() > deadline:
                raise SystemExit(f"demo: timed out waiting for {what}")
            time.sleep(0.1)

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.communicate()


def first_attempt_long(work: Path, name: str, seconds: int, echo: str) -> str:
    """A command that runs `seconds` on its first attempt, and quickly on a retry."""
    mark = work / f"{name}.started"
    script = (f'echo "{echo}"; if [ -e {mark} ]; then sleep 0.3; exit 0; fi; '
              f"touch {mark}; sleep {seconds}")
    return "command:" + json.dumps({"argv": ["sh", "-c", script]})


def story(d: Demo) -> int:
    d.step("1. schema: migrations under an advisory lock (twice is harmless)")
    d.cli("migrate")
    d.cli("migrate")

    d.step("2. enqueue table maintenance on exclusive resources")
    orders = d.enqueue(first_attempt_long(d.work, "orders", 30, "compacting db.orders"),
                       "--resource", "db.orders", "--priority", "9")
    users = d.enqueue(first_attempt_long(d.work, "users", 6, "compacting db.users"),
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
    d.cli("list")

    d.step("3. workers claim jobs; one is SIGKILLed and one is paused (SIGSTOP) mid-job")
    w1 = d.worker("worker-1")
    d.wait_until("worker-1 to claim db.orders", lambda: d.job(orders)["status"] == "running")
    w2 = d.worker("worker-2")
    d.wait_until("worker-2 to claim db.users", lambda: d.job(users)["status"] == "running")
    w3 = d.worker("worker-3", max_jobs=10)
    time.sleep(1.0)
    w1.send_signal(signal.SIGKILL)
    d.say(f"{RED}SIGKILL{RESET} worker-1 while it runs the db.orders compaction "
          "(its child dies with it)")
    w2.send_signal(signal.SIGSTOP)
    d.say(f"{RED}SIGSTOP{RESET} worker-2 while it runs the db.users compaction "
          "(a long GC pause, a frozen node)")
    w3.communicate(timeout=60)
    d.say("worker-3 ran the other jobs; the flaky one failed once and waits out its backoff")

    d.step("4. the leases run out; one sweeper pass rotates the fences")
    d.wait_until("the leases to expire", lambda: all(
        d.job(j)["lease_expires_at"] is None
        or time.time() > _ts(d.job(j)["lease_expires_at"]) for j in (orders, users)))
    d.cli("sweeper")

    d.step("5. new workers (as KEDA would start them) finish both with a second attempt")
    n = 4
    deadline = time.monotonic() + 40
    while any(d.job(j)["status"] not in ("succeeded", "failed") for j in (orders, users, flaky)):
        if time.monotonic() > deadline:
            raise SystemExit("demo: jobs did not finish in time")
        d.worker(f"worker-{n}", max_jobs=5).communicate(timeout=60)
        n += 1
        time.sleep(0.3)

    d.step("6. worker-2 wakes up (SIGCONT): its fence is gone, so it writes nothing")
    w2.send_signal(signal.SIGCONT)
    _, err = w2.communicate(timeout=30)
    for line in err.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") in ("self_fenced", "writeback_stale_attempt"):
            d.say(f"{GREEN}worker-2 log:{RESET} {event['event']}: {event.get('message')}")
    d.say(f"worker-2 exited {w2.returncode}")

    d.step("7. what happened (from the audit trail)")
    rows = [("db.orders", orders, "worker-1 SIGKILLed"), ("db.users", users, "worker-2 paused"),
            ("db.events", events, ""), ("db.events.snapshots", expiry, "after db.events"),
            ("db.clicks", flaky, "failed once, retried")]
    print(f"   {'RESOURCE':<22}{'STATUS':<11}{'ATTEMPTS':<10}{'CLAIMS (audit)':<34}NOTE")
    ok = True
    for resource, job_id, note in rows:
        j = d.job(job_id)
        claims = [e["reason"].removeprefix("claimed by ") for e in j["events"]
                  if e["to_status"] == "running"]
        terminal = [e for e in j["events"] if e["to_status"] in ("succeeded", "failed",
                                                                    "cancelled")]
        ok &= j["status"] == "succeeded" and len(terminal) == 1
        colour = GREEN if j["status"] == "succeeded" else RED
        print(f"   {resource:<22}{colour}{j['status']:<11}{RESET}"
              f"{j['attempt_count']}/{j['max_attempts']:<8}{' -> '.join(claims):<34}{note}")
    print()
    d.cli("status", users, "--events")
    verdict = ("every job finished exactly once" if ok else "SOMETHING WENT WRONG")
    print(f"\n{BOLD}{verdict}.{RESET} Next: `make test`, and `jobfence --help`.")
    return 0 if ok else 1


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def main() -> int:
    started = time.monotonic()
    with ExitStack() as stack:
        dsn = os.environ.get("JOBFENCE_DATABASE_URL")
        if not dsn:
            from shared.embedded_pg import EmbeddedPostgres

            pg = stack.enter_context(EmbeddedPostgres())
            dsn = pg.dsn
            print(f"embedded PostgreSQL on 127.0.0.1:{pg.port} (deleted at exit)")
        import tempfile

        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jobfence-demo-")))
        demo = Demo(dsn, work)
        stack.callback(demo.cleanup)
        code = story(demo)
    print(f"{DIM}demo took {time.monotonic() - started:.0f}s{RESET}")
    return code


if __name__ == "__main__":
    sys.exit(main())
