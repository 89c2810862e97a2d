"""Every benchmark `make bench` lists can be imported and run (the figures themselves are
measured by `make bench`, never asserted in tests)."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO


def test_every_registered_benchmark_imports_and_has_a_run_function() -> None:
    r = subprocess.run([sys.executable, "-m", "bench.run", "--list"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert {"throughput", "dependents", "coldstart"} <= set(r.stdout.split())
