"""The draining pool on the real KEDA operator, beside the ideal and beside the same run on
the Python model of KEDA (devtools/platform.py).

The real run: a local cluster as ``make cluster-up`` starts it (the control plane, the KEDA
operator, a node — containerd and a kubelet running the image — and its PostgreSQL), the base deployed as ``make deploy`` applies it
(its CronJobs suspended, so that only the pool works), and the shipped draining pool as
manifests/pools.yaml declares it: its ``pollingInterval``, ``maxReplicaCount`` and worker
arguments. 500 jobs of 100 ms are enqueued just after KEDA ran the pool's query (seen in
``pg_stat_activity``): the clock starts at that poll, so the first poll that can see them is
a full interval away, and stops at the last job's finish (both the database's clock).

Pod start: for each pod, from its Job's creation (the API's timestamp, whole seconds) to its
first claim — the Job controller, the scheduler, the kubelet's sandbox, network and
containers (the command sidecar first), Python's imports. Ideal: jobs × duration ÷ pods + pod start + one poll.

The model run: the same pool and jobs on LocalPlatform, whose pods are processes started
after a simulated 2 s (bench_pools.POD_START); the clock starts at its first poll (as it
starts), the jobs enqueued right after; its pod start is measured the same way (process
spawned → first claim).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_pools import DURATION, POD_START, shipped
from bench.common import JOBFENCE, REPO, Bench, Section
from devtools import controlplane, image, keda
from devtools.cluster import network
from devtools.cluster.plane import NAMESPACE, Plane, Ports
from devtools.deploy import Kubectl, apply, overlay
from devtools.embedded_pg import free_port
from devtools.gobuild import go_env, run_go
from devtools.platform import LocalPlatform, Proc
from devtools.roles import login_name
from devtools.sqlconn import connect
from jobfence.pools import Pool

Obj = dict[str, Any]
SUSPENDED = {"target": {"kind": "CronJob"},
             "patch": json.dumps([{"op": "add", "path": "/spec/suspend", "value": True}])}


def enqueue(url: str, queue: str, jobs: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    env["JOBFENCE_DATABASE_URL"] = url
    spec = [{"actions": [{"name": "sleep", "params": {"seconds": DURATION}}],
             "queue": queue}] * jobs
    subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(spec), env=env,
                   cwd=REPO, capture_output=True, text=True, check=True)


def next_poll(admin_url: str, queue: str, timeout: float = 120) -> dt.datetime:
    """The start of KEDA's next run of ``queue``'s trigger query (the scaler login's
    session in pg_stat_activity)."""
    login = login_name("jobfence", "scaler")
    sql = ("SELECT max(query_start) AS at FROM pg_stat_activity WHERE usename = %s "
           "AND query LIKE %s")
    like = f"%queue = '{queue}'%"
    deadline = time.monotonic() + timeout
    with connect(admin_url) as conn:
        row = conn.execute(sql, (login, like)).fetchone()
        last = row["at"] if row else None
        while time.monotonic() < deadline:
            row = conn.execute(sql, (login, like)).fetchone()
            if row and row["at"] is not None and row["at"] != last:
                at: dt.datetime = row["at"]
                return at
            time.sleep(0.02)
    raise RuntimeError(f"KEDA did not poll queue {queue} within {timeout:.0f} s")


def outcome(url: str, jobs: int) -> tuple[dt.datetime, dict[str, dt.datetime]]:
    """The last finish, and each worker's first claim; checks every job succeeded on its
    one claim with its own fence."""
    with connect(url) as conn:
        row = conn.execute("SELECT count(*) FILTER (WHERE attempt_count = 1 AND "
                           "status = 'succeeded') AS once, count(DISTINCT attempt_id) AS "
                           "fences, max(finished_at) AS last FROM jobs").fetchone()
        assert row is not None and row["once"] == jobs == row["fences"], row
        firsts = {r["worker_id"]: r["first"] for r in conn.execute(
            "SELECT claimed_by AS worker_id, min(claimed_at) AS first FROM jobs "
            "GROUP BY claimed_by")}
    return row["last"], firsts


def wait_done(url: str, jobs: int, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    with connect(url) as conn:
        while True:
            row = conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'succeeded'"
                               ).fetchone()
            if row is not None and row["n"] == jobs:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pool did not finish within {timeout:.0f} s")
            time.sleep(0.1)


def stamp(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def real_run(pool: Pool, jobs: int) -> dict[str, Any]:
    kubectl_path = str(controlplane.path("kubectl"))
    with tempfile.TemporaryDirectory(prefix="jobfence-bench-keda-") as tmp:
        ports = Ports(api=free_port(), etcd=free_port(), etcd_peer=free_port(),
                      postgres=free_port())
        plane = Plane(Path(tmp) / "cluster", ports, quiet=True, netns="jobfence-bench",
                      images=tuple(image.archive()))
        where = REPO / "build" / "bench-keda-deploy"
        with network.returning():
            started = time.monotonic()
            plane.up()
            up = time.monotonic() - started
            return _measure(plane, pool, jobs, kubectl_path, where, up)


def _measure(plane: Plane, pool: Pool, jobs: int, kubectl_path: str, where: Path,
             up: float) -> dict[str, Any]:
    try:
        kubectl = Kubectl(kubectl_path, kubeconfig=str(plane.kubeconfig))
        overlay(namespace=NAMESPACE, image="localhost/jobfence:0.1.0", where=where,
                config={"JOBFENCE_S3_BUCKET": ""}, extra_patches=(SUSPENDED,))
        apply(kubectl, timeout=300, where=where)
        state = plane.state() or {}
        admin, urls = state["postgres"]["url"], state["postgres"]["urls"]
        t0 = next_poll(admin, pool.queue)
        enqueue(urls["operator"], pool.queue, jobs)
        wait_done(admin, jobs)
        last, firsts = outcome(admin, jobs)
        out = kubectl.run("-n", NAMESPACE, "get", "jobs", "-l",
                          f"scaledjob.keda.sh/name=jobfence-worker-{pool.name}",
                          "-o", "json")
        made = json.loads(out.stdout)["items"]
        starts = []
        for job in made:
            name = job["metadata"]["name"]
            mine = [t for w, t in firsts.items() if w.startswith(f"{name}-")]
            if mine:
                starts.append((min(mine) - stamp(job["metadata"]["creationTimestamp"])
                               ).total_seconds())
        return {"took": (last - t0).total_seconds(), "pods": len(made),
                "claiming": len(starts), "pod_start": statistics.median(starts),
                "up": up}
    finally:
        plane.down(quiet=True)
        shutil.rmtree(where, ignore_errors=True)


def model_run(bench: Bench, pool: Pool, jobs: int) -> dict[str, Any]:
    dsn = bench.database()
    penv = bench.deployed_env(dsn)
    spawned: dict[int, float] = {}

    def note(proc: Proc) -> None:
        spawned[proc.popen.pid] = time.time()

    with tempfile.TemporaryDirectory(prefix="jobfence-bench-model-") as tmp:
        platform = LocalPlatform(dsn, penv, Path(tmp), schedules={},
                                 poll_seconds=pool.polling_interval, pools=(pool,),
                                 pod_start_seconds=POD_START)
        platform.on_spawn = note
        t0 = dt.datetime.now(dt.UTC)
        platform.start()  # it polls at once (the queue empty), as KEDA's loop does
        try:
            if not platform.polled.wait(60):
                raise RuntimeError("the model did not poll")
            enqueue(dsn, pool.queue, jobs)
            wait_done(dsn, jobs)
        finally:
            platform.stop()
    last, firsts = outcome(dsn, jobs)
    host = socket.gethostname()
    starts = [(firsts[w] - dt.datetime.fromtimestamp(at, dt.UTC)).total_seconds()
              for pid, at in spawned.items()
              if (w := f"local:{platform.installation}:{host}:{pid}") in firsts]
    return {"took": (last - t0).total_seconds(), "pods": platform.workers_started[pool.name],
            "claiming": len(starts), "pod_start": statistics.median(starts)}


def cold_build() -> list[str]:
    """``make keda``'s compile into an empty Go build cache (modules already downloaded)."""
    from bench.bench_controlplane import du

    go, version = keda.TOOL.toolchain()
    with tempfile.TemporaryDirectory(prefix="jobfence-cold-keda-") as tmp:
        cache, out = Path(tmp) / "gocache", Path(tmp) / "bin"
        env = {**go_env(), "GOCACHE": str(cache)}
        run_go(go, "mod", "download", cwd=keda.HERE, env=env)
        started = time.monotonic()
        built = keda.TOOL.compile_one(go, keda.OPERATOR, out, env)
        took = time.monotonic() - started
        return [f"cold build of the operator (Go {version}, {os.cpu_count()} cores, nice 10)",
                f"{took / 60:.1f} min", f"binary {built.stat().st_size / 1e6:.0f} MB, Go "
                f"build cache {du(cache) / 1e9:.1f} GB"]


def run_build(bench: Bench) -> Section:
    """The operator's cold build (``python -m bench.run --only keda_build``)."""
    s = Section("The KEDA operator's cold build", "python -m bench.run --only keda_build",
                ["what", "time", "detail"])
    if bench.quick:
        s.notes.append("Skipped (--quick): about a quarter of an hour of two cores' time.")
        return s
    s.rows.append(cold_build())
    s.notes.append(f"`CGO_ENABLED=0 go build {' '.join(keda.FLAGS)}` of "
                   f"`{keda.PACKAGE}` into an empty `GOCACHE`, the modules already "
                   "downloaded, at `nice 10` as `make keda` builds it, on a machine shared "
                   "with other work: it links every scaler KEDA has. `make keda` caches the "
                   "binary; later runs only link it.")
    return s


def run(bench: Bench) -> Section:
    pool = shipped()["draining"]
    jobs = 100 if bench.quick else 500
    s = Section("The draining pool on the real KEDA operator, beside the Python model",
                "python -m bench.run --only keda",
                ["run", "jobs", "pods at once", "pods started (claimed)", "pod start",
                 "took", "ideal", "vs ideal", "target"])
    real = real_run(pool, jobs)
    model = model_run(bench, pool.model_copy(update={"queue": "bench"}), jobs)
    for name, r, target in (("real KEDA operator 2.20 (local cluster, kubelet)", real,
                             "≤ 1.5×"),
                            ("Python model (devtools/platform.py)", model, "—")):
        ideal = jobs * DURATION / pool.max_pods + r["pod_start"] + pool.polling_interval
        s.rows.append([name, jobs, pool.max_pods, f"{r['pods']} ({r['claiming']})",
                       f"{r['pod_start']:.1f} s", f"{r['took']:.1f} s", f"{ideal:.1f} s",
                       f"{r['took'] / ideal:.2f}×", target])
    s.notes.append(
        f"Pool `{pool.name}` as manifests/pools.yaml ships it: draining, `maxReplicaCount` "
        f"{pool.max_pods}, `pollingInterval` {pool.polling_interval} s; jobs of "
        f"{DURATION * 1000:.0f} ms (`sleep`), all enqueued just after a poll, so the first "
        "poll that sees them is a full interval away. Every job is checked to have succeeded "
        "on its one claim, with its own fence. Pod start: median of each pod's Job creation "
        "(whole seconds) → its first claim on the real cluster; process spawn → first claim "
        f"on the model (its simulated {POD_START:.0f} s included). Ideal: jobs × duration ÷ "
        "pods + pod start + one poll. The cluster's warm `cluster-up` for this run took "
        f"{real['up']:.1f} s.")
    fixed = jobs * DURATION / pool.max_pods + POD_START + pool.polling_interval
    s.notes.append(
        f"Taken with a fixed pod start of {POD_START:.0f} s instead (bench_pools' ideal, "
        f"{fixed:.1f} s), the real run is {real['took'] / fixed:.2f}× and the model "
        f"{model['took'] / fixed:.2f}×: beyond the poll, what a burst pays is its pods' own "
        f"start — {pool.max_pods} pods importing Python at once on this machine's cores "
        "(on the cluster each also starts its command sidecar), and the machine's other "
        "load, which moves it from run to run — not KEDA's arithmetic, which the model "
        "and the operator share (min(maxReplicaCount, value) − running Jobs).")
    return s
