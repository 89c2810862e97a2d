"""SIGTERM → job no longer `running`: the worker's shutdown watcher gives back the jobs in
hand — one, or ten at once — while their executions are blocked inside long `command`
actions. Target ≤ 0.5 s; Snowpack's shutdown watcher
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


def one(bench: Bench, dsn: str, markers: list[Path]) -> tuple[float, float]:
    """One worker holding len(markers) 60 s commands at once (``--concurrency``): from
    SIGTERM to every job no longer `running`, and to the worker's exit."""
    env = bench.env(dsn, JOBFENCE_LEASE_SECONDS="30")
    specs = [{"actions": [{"name": "command", "params": {
        "argv": ["sh", "-c", f'touch "{m}"; exec sleep 60']}}], "max_attempts": 3}
        for m in markers]
    r = subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(specs),
                       env=env, cwd=REPO, capture_output=True, text=True, check=True)
    job_ids = [json.loads(line)["job_id"] for line in r.stdout.splitlines() if line.strip()] \
        if not r.stdout.lstrip().startswith("[") else [j["job_id"] for j in json.loads(r.stdout)]
    n = str(len(markers))
    worker = subprocess.Popen([*JOBFENCE, "worker", "--concurrency", n, "--max-jobs", n],
                              env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not all(m.exists() for m in markers):
        if time.monotonic() > deadline:
            worker.kill()
            _, err = worker.communicate()
            raise RuntimeError(f"the worker never started its actions: {err[-2000:]}")
        time.sleep(0.01)
    conn = connect(dsn)
    try:
        t0 = time.perf_counter()
        os.kill(worker.pid, signal.SIGTERM)
        while True:
            row = conn.execute("SELECT count(*) AS n FROM jobs WHERE job_id = ANY(%s) "
                               "AND status = 'running'", (job_ids,)).fetchone()
            if row and row["n"] == 0:
                released = time.perf_counter() - t0
                break
            if time.perf_counter() - t0 > 30:
                raise RuntimeError("the jobs were not released within 30 s")
            time.sleep(0.002)
        worker.communicate(timeout=30)
        exited = time.perf_counter() - t0
    finally:
        conn.close()
        for m in markers:
            m.unlink(missing_ok=True)
    return released, exited


def run(bench: Bench) -> Section:
    n = 5 if bench.quick else 20
    s = Section(
        "SIGTERM to tidy",
        "python -m bench.run --only sigterm",
        ["measure", f"median of {n}", "p95", "vs target 0.5 s", "vs Snowpack's ~2 s"])
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in (1, 10):
            released, exited = [], []
            for i in range(n):
                markers = [Path(tmp) / f"started-{i}-{k}" for k in range(jobs)]
                r, e = one(bench, bench.database(), markers)
                released.append(r)
                exited.append(e)
            what = "the job" if jobs == 1 else f"all {jobs} jobs (`--concurrency {jobs}`)"
            s.rows.append([f"SIGTERM → {what} not `running`",
                           f"{median(released) * 1000:.0f} ms",
                           f"{p95(released) * 1000:.0f} ms",
                           f"{median(released) / TARGET_SECONDS:.2f}×",
                           f"{median(released) / SEED_SECONDS:.3f}×"])
            s.rows.append([f"SIGTERM → worker exited ({jobs} children killed)",
                           f"{median(exited) * 1000:.0f} ms", f"{p95(exited) * 1000:.0f} ms",
                           "—", "—"])
    s.notes.append("The jobs go back to `pending` at once (attempts remain), not to "
                   "Snowpack's terminal `failed`; every child's process group is SIGKILLed "
                   "first, and every job in hand is given back by one statement.")
    return s
