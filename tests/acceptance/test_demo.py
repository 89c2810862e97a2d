"""`make demo` end to end: embedded PostgreSQL, moto's S3, the local platform standing in for
KEDA and the CronJobs, a worker SIGKILLed and one paused — it exits 0 and prints its summary
(what the README promises a new user)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO


def test_demo_runs_the_whole_story_and_prints_the_summary() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    r = subprocess.run([sys.executable, "-m", "demo.run"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=240, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "every job finished exactly once; nothing lost, nothing stuck" in out
    assert "matched no row — the fence" in out
    # Reconciliation, not the lease, took the SIGKILLed worker's job back: its pod is gone, or
    # not reaped yet (a zombie is a pod in phase Failed).
    back = next(line for line in out.splitlines() if "db.orders back to pending" in line)
    assert "disappeared" in back or " is Failed" in back, back
    assert "jobs still running: 0; jobs with two terminal writes: 0" in out
    # The console was up on 127.0.0.1 and served the story through its API.
    assert "the console: http://127.0.0.1:" in out
    served = next(line for line in out.splitlines() if "served" in line and "console" in line)
    assert "served 2 queues" in served and " 0 jobs" not in served, served
    # The operator's view: job metrics folded from the audit trail, lost fences counted.
    assert "jobs finished in datums: succeeded 13" in out  # 12 children and their parent
    outcomes = next(line for line in out.splitlines() if "attempts by outcome:" in line)
    assert "lost" in outcomes and "retried" in outcomes, outcomes
    # Two pools: the paused queue held its work while the other drained, then draining
    # workers ran it, fewer of them than jobs.
    held = next(line for line in out.splitlines() if "the default queue drained" in line)
    assert "still holds 12 ready jobs, paused" in held, held
    ran = next(line for line in out.splitlines() if "draining workers ran the 12" in line)
    assert int(ran.split()[0]) < 12, ran
