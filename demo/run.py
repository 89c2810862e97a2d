"""`make demo`: the main story on embedded defaults — a throwaway PostgreSQL (or
$JOBFENCE_DATABASE_URL), the real `jobfence` CLI, and what the fence does.

This version stops after enqueue and status: the worker and sweeper come next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def step(title: str) -> None:
    print(f"\n{BOLD}== {title}{RESET}")


def jobfence(env: dict[str, str], *args: str, expect: int = 0) -> str:
    print(f"{DIM}$ jobfence {' '.join(args)}{RESET}")
    r = subprocess.run([sys.executable, "-m", "functions.cli", *args], env=env, cwd=REPO,
                       capture_output=True, text=True, check=False)
    out = r.stdout.strip()
    if out:
        print(out)
    if r.returncode != 0:
        msg = [ln for ln in r.stderr.splitlines() if ln.startswith("jobfence:")]
        print(f"  -> exit {r.returncode}: {msg[-1] if msg else r.stderr.strip()[-300:]}")
    if r.returncode != expect:
        raise SystemExit(f"demo: expected exit {expect} from `jobfence {args[0]}`, "
                         f"got {r.returncode}\n{r.stderr}")
    return out


def main() -> int:
    with ExitStack() as stack:
        dsn = os.environ.get("JOBFENCE_DATABASE_URL")
        if not dsn:
            from shared.embedded_pg import EmbeddedPostgres

            pg = stack.enter_context(EmbeddedPostgres())
            dsn = pg.dsn
            print(f"embedded PostgreSQL on 127.0.0.1:{pg.port} (deleted at exit)")
        env = {**os.environ, "JOBFENCE_DATABASE_URL": dsn, "JOBFENCE_LOG_FORMAT": "console",
               "PYTHONPATH": str(REPO)}

        step("schema: migrations under an advisory lock (run twice: harmless)")
        jobfence(env, "migrate")
        jobfence(env, "migrate")

        step("table maintenance on an exclusive resource")
        compact = json.loads(jobfence(
            env, "enqueue", 'command:{"argv": ["echo", "compacting db.events"]}',
            "--resource", "db.events", "--timeout", "PT1H", "--ttl", "P7D"))["job_id"]
        print("a second job on the same table is refused by the database's unique index:")
        jobfence(env, "enqueue", 'sleep:{"seconds": 1}', "--resource", "db.events", expect=3)
        jobfence(env, "enqueue", 'sleep:{"seconds": 1}', "--after", compact,
                 "--resource", "db.events.snapshots")

        step("drain mode: refuse new work during an upgrade")
        jobfence(env, "drain", "on", "--reason", "upgrade")
        jobfence(env, "enqueue", 'sleep:{"seconds": 1}', expect=4)
        jobfence(env, "drain", "off")

        step("bad input is rejected before anything is written")
        jobfence(env, "enqueue", 'sleep:{"seconds": 1}', "--ttl", "90 minutes", expect=2)

        step("the queue")
        jobfence(env, "list")
        jobfence(env, "status", compact, "--events")

        print(f"\n{BOLD}This version stops after enqueue and status: the worker and the "
              f"sweeper arrive next.{RESET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
