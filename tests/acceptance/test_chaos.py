"""The short chaos run (`make chaos` at 120 jobs, 20 s of faults), every process reaching
PostgreSQL through a real PgBouncer in transaction mode: workers SIGKILLed, SIGTERMed and
paused past their lease, server connections terminated, jobs cancelled and PostgreSQL
restarted behind the pooler while the periodic functions run, some workers running several
jobs at once (one of them in a queue limited below that) — and every invariant holds,
judged from the audit trail and the object store (bench/chaos_checks.py). `make chaos`
runs the full size directly against the server."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import REPO


# The drain's bound is liveness on a shared two-core machine that runs the rest of the suite
# (a kubelet and its pods among it) at the same time: generous; every safety invariant is
# judged whatever it takes.
@pytest.mark.timeout(600)
def test_short_chaos_run_violates_no_invariant() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    r = subprocess.run([sys.executable, "-m", "bench.chaos", "--jobs", "120", "--quick",
                        "--drain-timeout", "300", "--pgbouncer"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=540, check=False)
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-3000:]
    assert "chaos: passed" in out
    assert "VIOLATED" not in out
    assert "restart PostgreSQL" in out and "SIGKILL a worker" in out
    assert "through PgBouncer (transaction mode)" in out
    assert "jobs at once per worker: default 1, datums 4, limited 3" in out
