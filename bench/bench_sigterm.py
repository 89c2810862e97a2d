"""SIGTERM → job no longer `running`: the worker's shutdown watcher releases the job while
the main thread is blocked inside a long `command` action. Target ≤ 0.5 s; Snowpack's shutdown watcher
takes about 2 s. Measured from the signal to the moment the database shows the job released,
polled every 2 ms on a separate connection; also the time until the worker process exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import JOBFENCE, REPO, Bench, Section, median, p95
from devtools.sqlconn import connect

SEED_SECONDS = 2.0
TARGET_SECONDS = 0.5


def one(bench: Bench, dsn: str, marker: Path) -> tuple[float, float]:
    env = bench.env(dsn, JOBFENCE_LEASE_SECONDS="30")
    spec = {"actions": [{"name": "command", "params": {
        "argv": ["sh", "-c", f'touch "{marker}"; exec sleep 60']}}], "max_attempts": 3}
    r = subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(spec),
                       env=env, cwd=REPO, capture_output=True, text=True, check=True)
    job_id = json.loads(r.stdout)["job_id"]
    worker = subprocess.Popen([*JOBFENCE, "worker"], env=env, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not marker.exists():
        if time.monotonic() > deadline:
            worker.kill()
            _, err = worker.communicate()
            raise RuntimeError(f"the worker never started its action: {err[-2000:]}")
        time.sleep(0.01)
    conn = connect(dsn)
    try:
        t0 = time.perf_counter()
        os.kill(worker.pid, signal.SIGTERM)
        while True:
            row = conn.execute("SELECT status FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
            if row and row["status"] != "running":
                released = time.perf_counter() - t0
                break
            if time.perf_counter() - t0 > 30:
                raise RuntimeError("the job was not released within 30 s")
            time.sleep(0.002)
        worker.communicate(timeout=30)
        exited = time.perf_counter() - t0
    finally:
        conn.close()
        marker.unlink(missing_ok=True)
    return released, exited


def run(bench: Bench) -> Section:
    n = 5 if bench.quick else 20
    released, exited = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            r, e = one(bench, bench.database(), Path(tmp) / f"started-{i}")
            released.append(r)
            exited.append(e)
    s = Section(
        "SIGTERM to tidy",
        "python -m bench.run --only sigterm",
        ["measure", f"median of {n}", "p95", "vs target 0.5 s", "vs Snowpack's ~2 s"])
    s.rows.append(["SIGTERM → job not `running`", f"{median(released) * 1000:.0f} ms",
                   f"{p95(released) * 1000:.0f} ms",
                   f"{median(released) / TARGET_SECONDS:.2f}×",
                   f"{median(released) / SEED_SECONDS:.3f}×"])
    s.rows.append(["SIGTERM → worker exited (child killed)", f"{median(exited) * 1000:.0f} ms",
                   f"{p95(exited) * 1000:.0f} ms", "—", "—"])
    s.notes.append("The job goes back to `pending` at once (attempts remain), not to Snowpack's "
                   "terminal `failed`; the child process group is SIGKILLed first.")
    return s
