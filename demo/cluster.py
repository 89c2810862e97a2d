"""`make demo-cluster`: the demo's story on the real control plane.

A local cluster as `make cluster-up` starts it (etcd, kube-apiserver, the controllers, the
KEDA operator, a node — containerd and a kubelet running the image — and a PostgreSQL), in
its own directory (build/demo-cluster) and network namespace (jobfence-demo), so that it
runs beside a `make cluster-up`; jobfence deployed as `make deploy` deploys it, with the
console component.
Then, each step shown as `kubectl` shows it:

1. two pools scale from zero as work arrives: KEDA runs each pool's trigger query and
   creates Jobs, their pods claim the jobs, and the pools go back to zero;
2. a worker pod deleted mid-job: the kubelet sends SIGTERM, tini passes it on, the worker
   gives the job back, another pod runs it;
3. a worker pod stops answering (its processes frozen) and is force-deleted: nothing gives
   the job back — reconciliation, a CronJob run by hand, finds the claim's pod gone and
   reclaims it;
4. a paused queue holds its work (KEDA starts nothing for it) until resumed;
5. the console (`jobfence serve`, as the console's pod runs it, with its ServiceAccount's
   token) asked with a person's real ServiceAccount token;
6. the audit trail of the jobs that went through all this.

What differs from the shipped manifests, in the demo's overlay only: the pools poll every
3 s (shipped: 10 s), reconciliation judges a claim at once (shipped: after 15 s), and the
CronJobs are suspended (the demo runs them by hand). Needs root (the node, its network
namespace), the binaries `make controlplane` and `make keda` build and the image archives
`make image-archive` writes; `--keep` leaves the cluster up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from devtools import REPO, controlplane, image
from devtools.cluster.plane import NAMESPACE, Plane, Ports
from devtools.deploy import Kubectl, apply, overlay
from devtools.embedded_pg import free_port
from devtools.platform import JOBFENCE
from devtools.roles import login_name
from devtools.sqlconn import connect

T = TypeVar("T")
ROOT = REPO / "build" / "demo-cluster"
OVERLAY = REPO / "build" / "demo-cluster-deploy"
POLLING = 3
NETNS = "jobfence-demo"
TTY = sys.stdout.isatty()
BOLD, DIM, GREEN, RESET = (("\033[1m", "\033[2m", "\033[32m", "\033[0m") if TTY
                           else ("",) * 4)


def say(text: str) -> None:
    print(f"\n{BOLD}== {text}{RESET}", flush=True)


def note(text: str) -> None:
    print(f"   {text}", flush=True)


def wait(fn: Callable[[], T], what: str, timeout: float = 180) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"demo-cluster: {what}: not within {timeout:.0f} s")
        time.sleep(0.3)


class Story:
    def __init__(self, plane: Plane, kubectl: str) -> None:
        self.plane = plane
        self.kubectl = Kubectl(kubectl, kubeconfig=str(plane.kubeconfig))
        state = plane.state() or {}
        self.admin_url: str = state["postgres"]["url"]
        self.urls: dict[str, str] = state["postgres"]["urls"]
        self.ids: dict[str, str] = {}

    # -- tools ----------------------------------------------------------------------------

    def k(self, *args: str, show: bool = True) -> str:
        out = self.kubectl.run("-n", NAMESPACE, *args, check=False)
        if show:
            print(f"{DIM}$ kubectl -n {NAMESPACE} {' '.join(args)}{RESET}")
            print(out.stdout.rstrip() or out.stderr.rstrip(), flush=True)
        return out.stdout

    def view(self) -> None:
        self.k("get", "scaledjobs,jobs,pods", "-l", "app.kubernetes.io/component=worker")

    def cli(self, role: str, *args: str, show: bool = True) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
        env["JOBFENCE_DATABASE_URL"] = self.urls[role]
        if show:
            print(f"{DIM}$ jobfence {' '.join(args)}{RESET}")
        out = subprocess.run([*JOBFENCE, *args], env=env, cwd=REPO, capture_output=True,
                             text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"demo-cluster: jobfence {args[0]} failed: {out.stderr.strip()}")
        if show and out.stdout.strip():
            print(out.stdout.rstrip(), flush=True)
        return out.stdout

    def enqueue(self, queue: str, n: int, seconds: float) -> list[str]:
        spec = json.dumps([{"actions": [{"name": "sleep", "params": {"seconds": seconds}}],
                            "queue": queue}] * n)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
        env["JOBFENCE_DATABASE_URL"] = self.urls["operator"]
        print(f"{DIM}$ jobfence enqueue --spec - # {n} jobs of sleep {seconds} s on {queue}{RESET}")
        out = subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=spec, env=env,
                             cwd=REPO, capture_output=True, text=True, check=True)
        return [json.loads(line)["job_id"] for line in out.stdout.splitlines() if line]

    def sql(self, query: str, *params: Any) -> list[dict[str, Any]]:
        with connect(self.admin_url) as conn:
            return list(conn.execute(query, params).fetchall())

    def statuses(self, ids: list[str]) -> dict[str, int]:
        rows = self.sql("SELECT status, count(*) AS n FROM jobs WHERE job_id = ANY(%s::uuid[]) "
                        "GROUP BY status", ids)
        return {r["status"]: r["n"] for r in rows}

    def done(self, ids: list[str]) -> bool:
        return self.statuses(ids).get("succeeded", 0) == len(ids)

    def worker_jobs_running(self) -> int:
        out = json.loads(self.k("get", "jobs", "-l", "scaledjob.keda.sh/name", "-o", "json",
                                show=False))
        return sum(1 for j in out["items"]
                   if not any(c["status"] == "True" and c["type"] in ("Complete", "Failed")
                              for c in (j.get("status") or {}).get("conditions") or []))

    def polls(self, queue: str, times: int = 2) -> None:
        """Wait until KEDA ran ``queue``'s trigger query ``times`` more times."""
        login = login_name("jobfence", "scaler")
        seen: set[Any] = set()
        began = self.sql("SELECT now() AS t")[0]["t"]

        def enough() -> bool:
            for r in self.sql("SELECT query_start FROM pg_stat_activity WHERE usename = %s "
                              "AND query LIKE %s AND query_start > %s", login,
                              f"%queue = '{queue}'%", began):
                seen.add(r["query_start"])
            return len(seen) >= times

        wait(enough, f"KEDA polling {queue}")

    def running_on(self, job: str) -> str:
        """The pod holding ``job``'s claim, once it runs."""
        def claimed() -> str | None:
            rows = self.sql("SELECT status, claimed_by FROM jobs WHERE job_id = %s", job)
            return rows[0]["claimed_by"] if rows and rows[0]["status"] == "running" else None

        return wait(claimed, "the job running")

    # -- the story ------------------------------------------------------------------------

    def scale_from_zero(self) -> None:
        say("1. Two pools scale from zero as work arrives")
        note("Each pool is a ScaledJob; KEDA runs its trigger query (ready work + live "
             f"claims) every {POLLING} s as the scaler login and creates Jobs.")
        self.view()
        ids = self.enqueue("default", 2, 4) + self.enqueue("datums", 12, 0.5)
        for _ in range(3):
            time.sleep(POLLING + 1)
            self.view()
        wait(lambda: self.done(ids), "the pools' work done")
        wait(lambda: self.worker_jobs_running() == 0, "the pools back at zero")
        note(f"{GREEN}all {len(ids)} jobs succeeded; no worker Job running: the pools are "
             f"back at zero{RESET}")
        self.view()

    def pod_deleted(self) -> None:
        say("2. A worker pod deleted mid-job: SIGTERM gives the job back")
        [job] = self.enqueue("default", 1, 6)
        self.ids["deleted"] = job
        pod = self.running_on(job)
        note(f"job {job} runs on pod {pod}")
        self.k("delete", "pod", pod, "--wait=false")
        wait(lambda: self.sql("SELECT interruptions FROM jobs WHERE job_id = %s",
                              job)[0]["interruptions"] == 1, "the job given back", 60)
        note("the worker gave the job back on SIGTERM (an interruption, its attempt not "
             "spent)")
        wait(lambda: self.done([job]), "the job done", 240)
        [row] = self.sql("SELECT claimed_by, attempt_count, interruptions FROM jobs "
                         "WHERE job_id = %s", job)
        note(f"KEDA started another pod, {row['claimed_by']}, that ran it to the end")
        self.view()

    def pod_lost(self) -> None:
        say("3. A node lost, its pod force-deleted: reconciliation reclaims the job")
        [job] = self.enqueue("default", 1, 8)
        self.ids["lost"] = job
        pod = self.running_on(job)
        uid = json.loads(self.k("get", "pod", pod, "-o", "json", show=False))["metadata"]["uid"]
        note(f"job {job} runs on pod {pod}; the pod stops answering (its processes frozen) "
             "and is force-deleted")
        for pid in self.plane.node.pids_of_pod(uid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        self.k("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")
        note("nothing gave the job back: it is still `running`, claimed by a pod that is "
             "gone")
        self.cli("reader", "status", job)
        say("   A CronJob run by hand: reconciliation")
        self.k("create", "job", "--from=cronjob/jobfence-reconciliation", "reconcile-now")
        wait(lambda: "Complete" in self.k("get", "job", "reconcile-now", "-o",
                                          "jsonpath={.status.conditions[*].type}",
                                          show=False), "reconciliation done")
        for line in self.k("logs", "job/reconcile-now", show=False).splitlines():
            if line.startswith("{") and '"function"' in line:
                note(f"reconciliation's summary: {line}")
        wait(lambda: self.done([job]), "the reclaimed job done", 240)
        note("reclaimed, claimed again by a new pod, and done")

    def paused(self) -> None:
        say("4. A paused queue holds its work")
        self.cli("operator", "queue", "pause", "datums")
        ids = self.enqueue("datums", 4, 0.5)
        self.polls("datums")
        note("KEDA polled twice since: its query answers 0 for a paused queue, nothing "
             "started")
        self.view()
        self.cli("reader", "queue", "status", "datums")
        self.cli("operator", "queue", "resume", "datums")
        wait(lambda: self.done(ids), "the resumed queue's work done")
        note(f"{GREEN}resumed: its {len(ids)} jobs ran{RESET}")

    def console(self) -> None:
        say("5. The console, asked with a person's ServiceAccount token")
        with self.plane.admin() as api:
            for account in ("oncall",):
                api.post(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                         {"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": account}})
        console_token = self.k("create", "token", "jobfence-console", show=False).strip()
        kubeconfig = ROOT / "console.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "console",
            "clusters": [{"name": "local", "cluster": {
                "server": self.plane.server,
                "certificate-authority": str(self.plane.pki / "ca.crt")}}],
            "users": [{"name": "console", "user": {"token": console_token}}],
            "contexts": [{"name": "console", "context": {"cluster": "local",
                                                         "user": "console"}}]}))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
        env.update({"JOBFENCE_DATABASE_URL": self.urls["operator"],
                    "JOBFENCE_READER_DATABASE_URL": self.urls["reader"],
                    "JOBFENCE_AUTH": "tokenreview", "JOBFENCE_CLUSTER": "kubernetes",
                    "JOBFENCE_NAMESPACE": NAMESPACE, "KUBECONFIG": str(kubeconfig)})
        log = (ROOT / "console.log").open("w")
        proc = subprocess.Popen([*JOBFENCE, "serve", "--host", "127.0.0.1", "--port",
                                 str(port)], env=env, cwd=REPO, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait(lambda: _get(f"{url}/healthz")[0] == 200, "the console up", 60)
            print(f"{DIM}$ kubectl -n {NAMESPACE} create token oncall{RESET}")
            person = self.k("create", "token", "oncall", show=False).strip()
            status, _ = _get(f"{url}/api/v1/jobs?limit=3")
            note(f"GET /api/v1/jobs without a token: {status}")
            status, body = _get(f"{url}/api/v1/jobs?limit=3", person)
            jobs = json.loads(body) if status == 200 else body
            note(f"GET /api/v1/jobs as system:serviceaccount:{NAMESPACE}:oncall: {status}")
            items = jobs.get("jobs", jobs.get("items", [])) if isinstance(jobs, dict) else []
            for j in items[:3]:
                note(f"  {j.get('job_id')} {j.get('queue')} {j.get('status')}")
            note(f"(the console stays up only for this step; `make cluster-up`, `make deploy "
                 f"COMPONENTS=console` and `jobfence serve` give you one: {url})")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()

    def audit(self) -> None:
        say("6. The audit trail")
        for what, job in self.ids.items():
            note(f"{BOLD}{what}{RESET}:")
            self.cli("reader", "status", "--events", job)


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(  # noqa: S310 (loopback)
        url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (loopback)
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.cluster", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the cluster up at the end")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("demo-cluster: the node (containerd, the kubelet) and its network namespace "
              "take root: run as root", file=sys.stderr)
        return 2
    archives = (image.OUT / "jobfence.tar", image.OUT / "pause.tar")
    if not all(a.is_file() for a in archives):
        print("demo-cluster: no image archives in build/image: `make image-archive` writes "
              "them", file=sys.stderr)
        return 2
    say("A local cluster (build/demo-cluster), with the KEDA operator")
    plane = Plane(ROOT, Ports(api=free_port(), etcd=free_port(), etcd_peer=free_port(),
                              postgres=free_port()), netns=NETNS, images=archives)
    plane.down(quiet=True)
    began = time.monotonic()
    plane.up()
    try:
        say("make deploy: the base with the console component")
        version = next(line.split('"')[1] for line in (REPO / "pyproject.toml").read_text()
                       .splitlines() if line.startswith("version = "))
        patches = [{"target": {"kind": "CronJob"}, "patch": json.dumps(
            [{"op": "add", "path": "/spec/suspend", "value": True}])},
            {"target": {"kind": "ScaledJob"}, "patch": json.dumps(
                [{"op": "replace", "path": "/spec/pollingInterval", "value": POLLING}])}]
        overlay(namespace=NAMESPACE, image=f"localhost/jobfence:{version}", components=("console",),
                where=OVERLAY, config={"JOBFENCE_S3_BUCKET": "",
                                       "JOBFENCE_RECONCILE_GRACE_SECONDS": "0"},
                extra_patches=patches)
        kubectl = str(controlplane.path("kubectl"))
        apply(Kubectl(kubectl, kubeconfig=str(plane.kubeconfig)), timeout=300, where=OVERLAY)
        story = Story(plane, kubectl)
        story.scale_from_zero()
        story.pod_deleted()
        story.pod_lost()
        story.paused()
        story.console()
        story.audit()
        say(f"Done in {time.monotonic() - began:.0f} s")
    finally:
        shutil.rmtree(OVERLAY, ignore_errors=True)
        if args.keep:
            print(f"\nThe cluster stays up: `. {ROOT.relative_to(REPO)}/env`, then kubectl; "
                  f"`python -m devtools.cluster down --dir {ROOT.relative_to(REPO)}` "
                  "stops it.")
        else:
            plane.down()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
