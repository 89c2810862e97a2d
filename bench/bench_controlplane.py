"""The local control plane (reported, not asserted; TARGETS.md asks for no ratio here):

* the cold build of each component — ``go build`` of etcd, kube-apiserver,
  kube-controller-manager and kubectl, in that order, into an empty Go build cache (the
  module downloads are not counted: they come from the machine's module cache), with each
  binary's size and how much the build cache grew for it (a later component reuses the
  packages an earlier one compiled: the order is the one ``make controlplane`` builds in);
* a warm ``cluster-up`` (binaries cached) to the point where a pod can run, by step, and
  ``cluster-down``;
* a CronJob's run by hand on it (``kubectl create job --from=cronjob/jobfence-sweeper``)
  from the create to the pod Succeeded, by stage, beside the same function run as a local
  process (``jobfence sweeper``, the same database): what the Kubernetes path adds.

``--quick`` skips the cold build (about ten minutes of two cores' time) and measures fewer
runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import JOBFENCE, REPO, Bench, Section, median, p95
from devtools import controlplane, image
from devtools.cluster import network
from devtools.cluster.plane import NAMESPACE, Plane, Ports
from devtools.deploy import Kubectl, apply, overlay
from devtools.embedded_pg import free_port
from devtools.gobuild import go_env, run_go

Obj = dict[str, Any]


def du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout else 0


def cold_builds(section: Section) -> None:
    go, version = controlplane.TOOL.toolchain()
    with tempfile.TemporaryDirectory(prefix="jobfence-cold-") as tmp:
        cache, out = Path(tmp) / "gocache", Path(tmp) / "bin"
        env = {**go_env(), "GOCACHE": str(cache)}
        run_go(go, "mod", "download", cwd=controlplane.HERE, env=env)
        for component in controlplane.COMPONENTS:
            before = du(cache) if cache.exists() else 0
            started = time.monotonic()
            built = controlplane.TOOL.compile_one(go, component, out, env)
            took = time.monotonic() - started
            grew = du(cache) - before
            section.rows.append([f"cold build: {component.name}", f"{took:.0f} s",
                                 f"binary {built.stat().st_size / 1e6:.0f} MB, "
                                 f"Go build cache +{grew / 1e6:.0f} MB"])
        section.notes.append(f"Cold builds with Go {version}, `CGO_ENABLED=0 go build "
                             f"{' '.join(controlplane.FLAGS)}`, an empty `GOCACHE`, the "
                             f"modules already downloaded ({os.cpu_count()} cores).")


def cluster_up(root: Path, images: tuple[Path, ...]) -> tuple[Plane, float]:
    ports = Ports(api=free_port(), etcd=free_port(), etcd_peer=free_port(),
                  postgres=free_port())
    plane = Plane(root, ports, quiet=True, netns="jobfence-bench", images=images)
    started = time.monotonic()
    plane.up()
    return plane, time.monotonic() - started


def pod_stages(kubectl: Kubectl, job: str) -> dict[str, float] | None:
    """Seconds from the Job's creation to its pod's creation, start and end, from the
    objects' own timestamps (seconds resolution) — or None while not finished."""
    import json

    out = kubectl.run("-n", NAMESPACE, "get", "pods", "-l",
                      f"batch.kubernetes.io/job-name={job}", "-o", "json")
    pods = json.loads(out.stdout)["items"]
    if not pods or pods[0]["status"].get("phase") != "Succeeded":
        return None
    pod = pods[0]
    [c] = pod["status"]["containerStatuses"]
    stamp = datetime.fromisoformat
    made = stamp(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    term = c["state"]["terminated"]
    return {"started": (stamp(term["startedAt"].replace("Z", "+00:00")) - made).total_seconds(),
            "finished": (stamp(term["finishedAt"].replace("Z", "+00:00"))
                         - made).total_seconds()}


def manual_runs(plane: Plane, kubectl: Kubectl, n: int) -> tuple[list[float], list[Obj]]:
    took, stages = [], []
    for i in range(n):
        name = f"bench-once-{i}"
        started = time.monotonic()
        kubectl.run("-n", NAMESPACE, "create", "job", "--from=cronjob/jobfence-sweeper", name)
        deadline = started + 120
        while (found := pod_stages(kubectl, name)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not succeed within 120 s")
            time.sleep(0.05)
        took.append(time.monotonic() - started)
        stages.append(found)
    return took, stages


def direct_runs(plane: Plane, n: int) -> list[float]:
    state = plane.state() or {}
    url = state["postgres"]["urls"]["maintainer"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    env.update({"JOBFENCE_DATABASE_URL": url, "JOBFENCE_INSTALLATION": "jobfence"})
    took = []
    for _ in range(n):
        started = time.monotonic()
        subprocess.run([*JOBFENCE, "sweeper"], env=env, cwd=REPO, capture_output=True,
                       check=True)
        took.append(time.monotonic() - started)
    return took


def run(bench: Bench) -> Section:
    section = Section("The local control plane: cold build, warm cluster-up, a CronJob run "
                      "by hand", "python -m bench.run --only controlplane",
                      ["what", "time", "detail"])
    if bench.quick:
        section.notes.append("Cold builds skipped (--quick).")
    else:
        cold_builds(section)
    kubectl_path = str(controlplane.path("kubectl"))
    ups, downs = [], []
    n = 2 if bench.quick else 3
    images = tuple(image.archive())
    with tempfile.TemporaryDirectory(prefix="jobfence-bench-cluster-") as tmp, \
            network.returning():
        for i in range(n):
            plane, took = cluster_up(Path(tmp) / f"c{i}", images)
            ups.append(took)
            if i < n - 1:
                started = time.monotonic()
                plane.down(quiet=True)
                downs.append(time.monotonic() - started)
        try:
            kubectl = Kubectl(kubectl_path, kubeconfig=str(plane.kubeconfig))
            where = REPO / "build" / "bench-deploy"
            overlay(namespace=NAMESPACE, image="localhost/jobfence:0.1.0", where=where)
            started = time.monotonic()
            apply(kubectl, timeout=300, where=where)
            deployed = time.monotonic() - started
            runs = 3 if bench.quick else 10
            manual, stages = manual_runs(plane, kubectl, runs)
            direct = direct_runs(plane, runs)
        finally:
            plane.down(quiet=True)
            shutil.rmtree(REPO / "build" / "bench-deploy", ignore_errors=True)
    section.rows += [
        ["warm `cluster-up` (etcd, API server, controllers, containerd and the kubelet with "
         "the image imported, PostgreSQL, CRDs, the KEDA operator)",
         f"{median(ups):.1f} s median of {n}", f"min {min(ups):.1f} s, max {max(ups):.1f} s"],
        ["`cluster-down`", f"{median(downs):.1f} s", "every process stopped, files removed"],
        ["`make deploy`'s apply on it (checks, server-side apply, migration Job)",
         f"{deployed:.1f} s", ""],
        ["`kubectl create job --from=cronjob/jobfence-sweeper` → pod Succeeded",
         f"{median(manual):.2f} s median, p95 {p95(manual):.2f} s",
         f"{runs} runs; Job created → container started "
         f"{median([s['started'] for s in stages]):.1f} s, → finished "
         f"{median([s['finished'] for s in stages]):.1f} s (the API's timestamps, whole "
         "seconds)"],
        ["the same `jobfence sweeper` as a local process (reference)",
         f"{median(direct):.2f} s median", "the Kubernetes path costs "
         f"{median(manual) / median(direct):.1f}× a bare run"],
    ]
    section.notes.append("A manual run's time is dominated by process start-ups (the "
                         "kubelet's sandbox and container, the container's Python, the "
                         "function's imports), the controllers' reaction and this "
                         "benchmark's 50 ms polling.")
    return section
