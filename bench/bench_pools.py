"""The deployment model: how long a pool takes to finish a burst of short jobs when KEDA
starts its pods, one job per pod vs draining, beside the ideal.

The local KEDA stand-in (devtools/platform.py) runs the pool's own trigger query at the
shipped `pollingInterval` and applies KEDA's default scaling strategy with the shipped
`maxReplicaCount`; every pod takes a simulated 2 s to start (scheduling, image pull) before
its `jobfence worker` process starts with the pool's own arguments, at the shipped log
settings. The clock starts at a poll that found the queue empty (the model polls as it
starts, as KEDA does), the jobs are enqueued right after it — so the first poll that sees
them is a full interval away, as when work arrives just after a poll — and it stops when
the last job succeeded. Ideal: jobs × duration ÷ pods + pod start + one poll.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import JOBFENCE, REPO, Bench, Section
from devtools.platform import LocalPlatform
from devtools.sqlconn import connect
from jobfence.pools import Pool, Pools

POD_START = 2.0
DURATION = 0.1


def shipped() -> dict[str, Pool]:
    """The pools manifests/pools.yaml ships, by mode."""
    pools = Pools.model_validate(yaml.safe_load((REPO / "manifests" / "pools.yaml").read_text()))
    return {p.mode: p for p in pools.pools}


def one_run(bench: Bench, pool: Pool, jobs: int) -> tuple[float, int]:
    """Seconds from the enqueue to the last success, and the pods started."""
    dsn = bench.database()
    penv = bench.deployed_env(dsn)
    spec = [{"actions": [{"name": "sleep", "params": {"seconds": DURATION}}],
             "queue": pool.queue}] * jobs
    with tempfile.TemporaryDirectory(prefix="jobfence-bench-pools-") as tmp:
        platform = LocalPlatform(dsn, penv, Path(tmp), schedules={},
                                 poll_seconds=pool.polling_interval, pools=(pool,),
                                 pod_start_seconds=POD_START)
        started = time.monotonic()
        platform.start()
        try:
            if not platform.polled.wait(60):
                raise RuntimeError("the model did not poll")
            subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(spec),
                           env=penv, cwd=REPO, capture_output=True, text=True, check=True)
            with connect(dsn) as conn:
                while True:
                    row = conn.execute("SELECT count(*) AS n FROM jobs "
                                       "WHERE status = 'succeeded'").fetchone()
                    if row is not None and row["n"] == jobs:
                        break
                    if time.monotonic() - started > 3600:
                        raise RuntimeError("the pool did not finish within an hour")
                    time.sleep(0.05)
            took = time.monotonic() - started
        finally:
            platform.stop()
    with connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FILTER (WHERE attempt_count = 1) AS once, "
                           "count(DISTINCT attempt_id) AS fences FROM jobs").fetchone()
    assert row is not None and row["once"] == jobs == row["fences"], row
    return took, platform.workers_started[pool.name]


def run(bench: Bench) -> Section:
    by_mode = shipped()
    jobs = 100 if bench.quick else 500
    s = Section("Worker pools on the deployment model: a burst of short jobs",
                "python -m bench.run --only pools",
                ["pool (as shipped)", "jobs", "pods at once", "pods started", "took",
                 "ideal", "vs ideal", "target"])
    for mode, target in (("one-per-pod", "—"), ("draining", "≤ 1.5×")):
        pool = by_mode[mode].model_copy(update={"queue": "bench"})
        took, pods = one_run(bench, pool, jobs)
        ideal = jobs * DURATION / pool.max_pods + POD_START + pool.polling_interval
        s.rows.append([f"`{pool.name}`: {mode}", jobs, pool.max_pods, pods, f"{took:.1f} s",
                       f"{ideal:.1f} s", f"{took / ideal:.2f}×", target])
    s.notes.append(
        f"Jobs of {DURATION * 1000:.0f} ms (`sleep`), all enqueued at once; each pool's "
        "`maxReplicaCount`, `pollingInterval` and worker arguments as manifests/pools.yaml "
        f"ships them; a simulated pod start of {POD_START:.0f} s before each worker process "
        "starts; log format and level as config.yaml deploys them. Ideal: jobs × duration ÷ "
        "pods + pod start + one poll. Every job is checked to have succeeded on its one "
        "claim, with its own fence.")
    s.notes.append(
        "One job per pod pays a pod start and a Python start per job and, once the first "
        "pods finish, waits for KEDA's next poll to start more: about one batch of "
        "`maxPods` jobs per polling interval. A draining pool pays the start once per pod: "
        "after the first poll its pods keep claiming until nothing is ready. What is left "
        "above the ideal is the pods' own start (20 Python processes importing jobfence at "
        "once on this machine's two cores) and the last jobs' tail.")
    return s
