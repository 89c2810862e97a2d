"""What a new user does from a fresh clone: `make cluster-up`, then `make deploy
KUBECONFIG=build/cluster/kubeconfig`, then a CronJob run by hand that completes; and
`make cluster-down`, which leaves nothing behind. Bad input says so in one line with exit
2 and starts nothing: no Go to build the control plane with, a port already taken, a
Secret the manifests read that is missing. (A cluster of its own, beside the session's, in
a directory and on ports of its own.)"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import psycopg

from devtools.cluster.processes import Started
from devtools.embedded_pg import free_port
from tests.kube import REPO, ControlPlane

MAKE_TIMEOUT = 600


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """make as a person runs it (not as a sub-make of `make test`)."""
    env = {k: v for k, v in (env or os.environ).items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=MAKE_TIMEOUT, check=False)


def ours(stderr: str) -> list[str]:
    """The lines that are not make's own (its "*** [target] Error 2")."""
    return [x for x in stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", x)]


def ports() -> list[str]:
    return [f"CLUSTER_API_PORT={free_port()}", f"CLUSTER_ETCD_PORT={free_port()}",
            f"CLUSTER_ETCD_PEER_PORT={free_port()}", f"CLUSTER_PG_PORT={free_port()}"]


def kubectl(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "build" / "bin" / "kubectl"), "--kubeconfig",
                           str(where / "kubeconfig"), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_cluster_up_deploy_and_a_manual_run_then_down_leaves_nothing(tmp_path: Path) -> None:
    where = tmp_path / "cluster"
    up = make("cluster-up", f"CLUSTER_DIR={where}", *ports())
    assert up.returncode == 0, up.stdout + up.stderr
    assert "make deploy KUBECONFIG=" in up.stdout
    state = json.loads((where / "state.json").read_text())
    assert "keda-operator" in state["processes"]  # the KEDA operator runs with it
    again = make("cluster-up", f"CLUSTER_DIR={where}", *ports())  # idempotent
    assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr
    try:
        deployed = make("deploy", f"KUBECONFIG={where / 'kubeconfig'}",
                        f"OVERLAY=build/test-deploy-up-{os.getpid()}")
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
        with psycopg.connect(env["JOBFENCE_DATABASE_URL"]) as conn:
            runs = conn.execute("SELECT function, trigger, status FROM jobfence.function_runs "
                                "WHERE trigger = 'manual'").fetchall()
        assert runs == [("sweeper", "manual", "succeeded")]
    finally:
        down = make("cluster-down", f"CLUSTER_DIR={where}")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not where.exists()
    for row in state["processes"].values():
        assert not Started(**row).alive()
    assert not Path(state["postgres"]["root"]).exists()


def test_without_go_cluster_up_says_so_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    where = tmp_path / "cluster"
    env = {**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
           "JOBFENCE_CONTROLPLANE_CACHE": str(tmp_path / "empty-cache")}
    out = make("cluster-up", f"CLUSTER_DIR={where}", *ports(), env=env)
    assert out.returncode == 2
    [line] = ours(out.stderr)
    assert line.startswith("controlplane: Go is not installed"), out.stderr
    assert not where.exists()


def test_a_taken_port_is_named_in_one_line_and_nothing_is_started(tmp_path: Path) -> None:
    where = tmp_path / "cluster"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = make("cluster-up", f"CLUSTER_DIR={where}", *ports(), f"CLUSTER_API_PORT={port}")
    assert out.returncode == 2
    [line] = ours(out.stderr)
    assert f"port {port}" in line and "CLUSTER_API_PORT" in line, out.stderr
    assert not where.exists()


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
