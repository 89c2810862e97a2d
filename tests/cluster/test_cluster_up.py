"""What a new user does from a fresh clone: `make cluster-up`, then `make deploy
KUBECONFIG=build/cluster/kubeconfig`, then a CronJob run by hand that completes; and
`make cluster-down`, which leaves nothing behind. Bad input says so in one line with exit
2 and starts nothing: no Go to build the control plane with, the network namespace taken,
not root, a Secret the manifests read that is missing. (A cluster of its own, beside the
session's, in a directory and a network namespace of its own: what talks to it runs in
that namespace, as `make cluster-shell` runs a person's shell.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.cluster import network
from devtools.cluster.plane import Plane
from devtools.cluster.processes import ClusterError, Started
from devtools.embedded_pg import free_port
from tests.support.kube import REPO, ControlPlane

MAKE_TIMEOUT = 600


def make(*args: str, env: dict[str, str] | None = None,
         netns: str | None = None) -> subprocess.CompletedProcess[str]:
    """make as a person runs it (not as a sub-make of `make test`), in network namespace
    ``netns`` if given."""
    env = {k: v for k, v in (env or os.environ).items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    inside = network.nsenter(netns) if netns else []
    return subprocess.run([*inside, "make", "--no-print-directory", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=MAKE_TIMEOUT,
                          check=False)


def ours(stderr: str) -> list[str]:
    """The lines that are not make's own (its "*** [target] Error 2")."""
    return [x for x in stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", x)]


def ports() -> list[str]:
    return [f"CLUSTER_API_PORT={free_port()}", f"CLUSTER_ETCD_PORT={free_port()}",
            f"CLUSTER_ETCD_PEER_PORT={free_port()}", f"CLUSTER_PG_PORT={free_port()}"]


def kubectl(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The kubectl `make cluster-up` puts on the env's PATH: it enters the namespace."""
    return subprocess.run([str(where / "bin" / "kubectl"), "--kubeconfig",
                           str(where / "kubeconfig"), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_cluster_up_deploy_and_a_manual_run_then_down_leaves_nothing(tmp_path: Path) -> None:
    where, netns = tmp_path / "cluster", f"jft-up-{os.getpid()}"
    up = make("cluster-up", f"CLUSTER_DIR={where}", f"CLUSTER_NETNS={netns}", *ports())
    assert up.returncode == 0, up.stdout + up.stderr
    assert "make deploy KUBECONFIG=" in up.stdout
    state = json.loads((where / "state.json").read_text())
    assert "keda-operator" in state["processes"]  # the KEDA operator runs with it
    assert {"containerd", "kubelet", "kube-scheduler"} <= set(state["processes"])
    again = make("cluster-up", f"CLUSTER_DIR={where}", f"CLUSTER_NETNS={netns}", *ports())
    assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr
    try:
        node = json.loads(kubectl(where, "get", "node", "-o", "json").stdout)
        [info] = [n["status"]["nodeInfo"] for n in node["items"]]
        assert info["containerRuntimeVersion"].startswith("containerd://"), info
        deployed = make("deploy", f"KUBECONFIG={where / 'kubeconfig'}",
                        f"OVERLAY=build/test-deploy-up-{os.getpid()}", netns=netns)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert "jobfence-migrate complete" in deployed.stdout
        made = kubectl(where, "-n", "jobfence", "create", "job",
                       "--from=cronjob/jobfence-sweeper", "once")
        assert made.returncode == 0, made.stderr
        done = kubectl(where, "-n", "jobfence", "wait", "--for=condition=complete",
                       "job/once", "--timeout=120s")
        assert done.returncode == 0, done.stderr
        env = dict(line.removeprefix("export ").split("=", 1)
                   for line in (where / "env").read_text().splitlines()
                   if line.startswith("export "))
        assert env["KUBECONFIG"] == str(where / "kubeconfig")
        runs = subprocess.run(
            [*network.nsenter(netns), sys.executable, "-c",
             "import sys, psycopg; print(psycopg.connect(sys.argv[1]).execute("
             "\"SELECT function, trigger, status FROM jobfence.function_runs "
             "WHERE trigger = 'manual'\").fetchall())", env["JOBFENCE_DATABASE_URL"]],
            capture_output=True, text=True, timeout=60, check=False)
        assert runs.stdout.strip() == "[('sweeper', 'manual', 'succeeded')]", runs.stderr
    finally:
        down = make("cluster-down", f"CLUSTER_DIR={where}")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not where.exists()
    for row in state["processes"].values():
        assert not Started(**row).alive()
    assert not Path(state["postgres"]["root"]).exists()
    assert not network.exists(netns)
    assert not Path(f"/run/jobfence/{netns}").exists()
    assert not Path(f"/var/lib/jobfence/{netns}").exists()
    assert not any(Path("/sys/fs/cgroup").glob(f"*/jobfence-{netns}"))  # its cgroups
    assert not [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if str(where) in line]


def test_without_go_cluster_up_says_so_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    where = tmp_path / "cluster"
    env = {**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
           "JOBFENCE_CONTROLPLANE_CACHE": str(tmp_path / "empty-cache")}
    out = make("cluster-up", f"CLUSTER_DIR={where}", *ports(), env=env)
    assert out.returncode == 2
    [line] = ours(out.stderr)
    assert line.startswith("controlplane: Go is not installed"), out.stderr
    assert not where.exists()


def test_a_taken_network_namespace_is_named_in_one_line_and_nothing_is_started(
        tmp_path: Path) -> None:
    where, netns = tmp_path / "cluster", f"jft-taken-{os.getpid()}"
    network.create(netns)  # another cluster's, or anyone's
    try:
        out = make("cluster-up", f"CLUSTER_DIR={where}", f"CLUSTER_NETNS={netns}", *ports())
        assert out.returncode == 2
        [line] = [x for x in ours(out.stderr) if x.startswith("cluster:")]
        assert f"network namespace {netns} exists already" in line, out.stderr
        assert not where.exists()
        assert network.exists(netns)  # not ours to remove
    finally:
        network.delete(netns)


def test_without_root_cluster_up_says_so_and_starts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    plane = Plane(tmp_path / "cluster", netns=f"jft-noroot-{os.getpid()}")
    with pytest.raises(ClusterError, match="take root: run cluster-up as root"):
        plane.up()
    assert not (tmp_path / "cluster").exists()
    assert not network.exists(plane.netns)


def test_make_deploy_names_each_missing_secret_and_applies_nothing(
        kube: ControlPlane, namespace: str) -> None:
    out = make("deploy", f"KUBECONFIG={kube.kubeconfig}", f"NAMESPACE={namespace}",
               f"OVERLAY=build/test-deploy-missing-{os.getpid()}")
    assert out.returncode == 2
    lines = [x for x in out.stderr.splitlines() if x.startswith("deploy:")]
    assert sorted(x.split()[2] for x in lines) == [
        f"jobfence-database-{role}" for role in
        ("maintainer", "operator", "owner", "scaler", "worker")], out.stderr
    assert all("missing in namespace" in x for x in lines)
    with kube.admin() as api:
        assert api.get(f"/apis/batch/v1/namespaces/{namespace}/cronjobs")["items"] == []
