"""The node agent does what a kubelet does for jobfence's pods, checked through the API as a
user sees it (and the container's own output): images it cannot map are refused with an
event; the environment (``env`` with ``$(VAR)`` and every ``valueFrom``, ``envFrom``); the
ServiceAccount token where in-cluster configuration reads it, and none when the pod does
not automount; emptyDirs shared between containers; a native sidecar started first and
stopped after the container; ``runAsUser``/``runAsGroup``; a read-only root; exit codes and
the terminal phase; a foreign finalizer left alone; and, restarted, the pods it no longer
runs reported Failed."""

from __future__ import annotations

import base64
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.cluster import processes
from devtools.cluster.rest import Rest
from tests.kube import REPO, ControlPlane, pod_body, restricted_container, wait_for

Obj = dict[str, Any]


def create(api: Rest, namespace: str, pod: Obj) -> Obj:
    return api.post(f"/api/v1/namespaces/{namespace}/pods", pod)


def phase_of(api: Rest, namespace: str, name: str, *phases: str, timeout: float = 60) -> Obj:
    def reached() -> Obj | None:
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod if (pod.get("status") or {}).get("phase") in phases else None

    return wait_for(reached, what=f"pod {name} {'/'.join(phases)}", timeout=timeout)


def events_of(api: Rest, namespace: str, name: str) -> list[Obj]:
    return api.get(f"/api/v1/namespaces/{namespace}/events",
                   fieldSelector=f"involvedObject.name={name}")["items"]


def test_an_image_it_cannot_map_is_refused_with_an_event(kube: ControlPlane,
                                                         namespace: str) -> None:
    pod = pod_body("team-image", labels={})
    pod["spec"]["containers"][0]["image"] = "registry.example/team-etl-worker:1.4"
    with kube.admin() as api:
        create(api, namespace, pod)
        [event] = wait_for(lambda: [e for e in events_of(api, namespace, "team-image")
                                    if e["reason"] == "Failed"], what="the refusal event")
        assert event["type"] == "Warning"
        assert "team-etl-worker" in event["message"] and "jobfence" in event["message"]
        # The event may come before the pod's status says why: wait for the status too.
        def refused_status() -> Obj | None:
            pod = api.get(f"/api/v1/namespaces/{namespace}/pods/team-image")
            return pod if (pod.get("status") or {}).get("containerStatuses") else None

        got = wait_for(refused_status, what="the refused container's status")
        assert got["status"]["phase"] == "Pending"
        [status] = got["status"]["containerStatuses"]
        assert status["state"]["waiting"]["reason"] == "ErrImagePull"


def test_a_container_gets_the_environment_a_kubelet_gives(kube: ControlPlane,
                                                         namespace: str) -> None:
    with kube.admin() as api:
        api.post(f"/api/v1/namespaces/{namespace}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
            "data": {"url": base64.b64encode(b"postgresql://x@db/x").decode()}})
        api.post(f"/api/v1/namespaces/{namespace}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
            "data": {"LEVEL": "info", "MODE": "fast"}})
        pod = pod_body("env", labels={"team": "data"}, command=["env"])
        container = pod["spec"]["containers"][0]
        container["resources"] = {"limits": {"memory": "256Mi"}}
        container["envFrom"] = [{"configMapRef": {"name": "settings"}, "prefix": "APP_"},
                                {"secretRef": {"name": "absent", "optional": True}}]
        container["env"] = [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TEAM", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.labels['team']"}}},
            {"name": "URL", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings",
                                                               "key": "MODE"}}},
            {"name": "MEMORY_MI", "valueFrom": {"resourceFieldRef": {
                "resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "GREETING", "value": "$(POD) in $(TEAM), $$(not expanded)"}]
        created = create(api, namespace, pod)
        phase_of(api, namespace, "env", "Succeeded")
    env = dict(line.split("=", 1) for line in
               kube.container_log(namespace, created).splitlines() if "=" in line)
    assert env["POD"] == env["HOSTNAME"] == "env"
    assert (env["TEAM"], env["URL"], env["MODE"]) == ("data", "postgresql://x@db/x", "fast")
    assert (env["APP_LEVEL"], env["APP_MODE"], env["MEMORY_MI"]) == ("info", "fast", "256")
    assert env["GREETING"] == "env in data, $(not expanded)"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == str(kube.plane.ports.api)


SCRIPT = """
for i in $(seq 100); do test -e /shared/sidecar-started && break; sleep 0.1; done
test -e /shared/sidecar-started || { echo "nothing from the sidecar"; exit 5; }
echo "uid=$(id -u) gid=$(id -g)"
echo "hostname=$(hostname)"
echo "namespace=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)"
test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token=yes
touch /etc/written 2>/dev/null && echo root=writable || echo root=read-only
touch /shared/from-main && echo shared=writable
"""


def test_sidecar_first_shared_emptydir_token_user_and_read_only_root(
        kube: ControlPlane, namespace: str) -> None:
    pod = pod_body("shape", labels={}, command=["sh", "-c", SCRIPT])
    spec = pod["spec"]
    spec["automountServiceAccountToken"] = True
    spec["volumes"] = [{"name": "shared", "emptyDir": {}}]
    main = spec["containers"][0]
    main["volumeMounts"] = [{"name": "shared", "mountPath": "/shared"}]
    main["securityContext"].update({"runAsUser": 2345, "runAsGroup": 3456,
                                    "readOnlyRootFilesystem": True})
    sidecar = restricted_container("sidecar", ["sh", "-c", "touch /shared/sidecar-started; "
                                               "trap 'echo stopped; exit 0' TERM; "
                                               "while :; do sleep 0.1; done"])
    sidecar["restartPolicy"] = "Always"
    sidecar["volumeMounts"] = [{"name": "shared", "mountPath": "/shared"}]
    spec["initContainers"] = [sidecar]
    with kube.admin() as api:
        created = create(api, namespace, pod)
        done = phase_of(api, namespace, "shape", "Succeeded", "Failed")
    out = kube.container_log(namespace, created)
    assert done["status"]["phase"] == "Succeeded", out
    assert "uid=2345 gid=3456" in out
    assert "hostname=shape" in out
    assert f"namespace={namespace}" in out and "token=yes" in out
    assert "root=read-only" in out and "shared=writable" in out
    assert "stopped" in kube.container_log(namespace, created, "sidecar")  # SIGTERM, after
    [side] = done["status"]["initContainerStatuses"]
    [container] = done["status"]["containerStatuses"]
    assert side["state"]["terminated"]["exitCode"] == 0
    assert side["state"]["terminated"]["startedAt"] <= container["state"]["terminated"][
        "startedAt"]


def test_a_volume_mounted_above_the_environment_does_not_hide_it(
        kube: ControlPlane, namespace: str) -> None:
    """A work tree under /tmp, and the pods' /tmp emptyDir: the image's files stay where they
    are, whatever volume a pod mounts above them (here the work tree's parent)."""
    above = str(REPO.parent)
    if above == "/":
        pytest.skip("the work tree is at the top level")
    pod = pod_body("covered", labels={}, command=[
        "sh", "-c", "jobfence --version && touch " + above + "/written && echo volume=writable"])
    spec = pod["spec"]
    spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": above}]
    with kube.admin() as api:
        created = create(api, namespace, pod)
        done = phase_of(api, namespace, "covered", "Succeeded", "Failed")
    out = kube.container_log(namespace, created)
    assert done["status"]["phase"] == "Succeeded", out
    assert "jobfence" in out and "volume=writable" in out
    assert not (REPO.parent / "written").exists()  # the volume's, not the host's


def test_no_token_when_the_pod_does_not_automount_and_exit_codes_are_reported(
        kube: ControlPlane, namespace: str) -> None:
    pod = pod_body("no-token", labels={}, command=[
        "sh", "-c", "ls /var/run/secrets/kubernetes.io/serviceaccount || exit 3"])
    with kube.admin() as api:
        create(api, namespace, pod)
        done = phase_of(api, namespace, "no-token", "Failed", "Succeeded")
    assert done["status"]["phase"] == "Failed"
    [c] = done["status"]["containerStatuses"]
    assert c["state"]["terminated"]["exitCode"] == 3


def test_a_foreign_finalizer_is_never_removed(kube: ControlPlane, namespace: str) -> None:
    pod = pod_body("kept", labels={}, finalizers=["example.com/keep"])
    with kube.admin() as api:
        created = create(api, namespace, pod)
        phase_of(api, namespace, "kept", "Running")
        api.delete(f"/api/v1/namespaces/{namespace}/pods/kept")
        stopped = phase_of(api, namespace, "kept", "Failed", "Succeeded")
        assert stopped["metadata"]["finalizers"] == ["example.com/keep"]
        assert stopped["metadata"]["deletionTimestamp"]
        wait_for(lambda: [e for e in kube.audit() if e["verb"] == "delete"
                          and e["objectRef"].get("name") == "kept"
                          and e["user"]["username"].startswith("system:node:")],
                 what="the agent's own delete")
        still = api.get(f"/api/v1/namespaces/{namespace}/pods/kept")
        assert still["metadata"]["finalizers"] == ["example.com/keep"]
        api.patch(f"/api/v1/namespaces/{namespace}/pods/kept", {"metadata": {"finalizers": []}})
        wait_for(lambda: not api.exists(f"/api/v1/namespaces/{namespace}/pods/kept"),
                 what="the pod gone once its finalizer is")
    assert created["metadata"]["uid"]


@pytest.fixture
def second_node(kube: ControlPlane, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Another node agent, for its own node, binding nothing: restarting it touches no
    other test's pods."""
    name = f"second-{os.getpid()}"
    kube.plane.node_identity(name)
    argv = [sys.executable, "-m", "devtools.cluster.agent", "--dir", str(kube.plane.root),
            "--node", name, "--api-port", str(kube.plane.ports.api), "--no-bind",
            "--root", str(tmp_path / "agent")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    node: dict[str, Any] = {"name": name, "argv": argv, "env": env,
                            "proc": processes.start(argv, log=tmp_path / "agent.log",
                                                    env=env, cwd=REPO)}
    yield node
    processes.stop(node["proc"], grace=5)
    with kube.admin() as api:
        api.delete(f"/api/v1/nodes/{name}")


def test_restarted_it_reports_the_pods_it_no_longer_runs_failed(
        kube: ControlPlane, namespace: str, second_node: dict[str, Any],
        tmp_path: Path) -> None:
    with kube.admin() as api:
        created = create(api, namespace, pod_body("orphaned", labels={},
                                                  node=second_node["name"]))
        phase_of(api, namespace, "orphaned", "Running")
        pid_file = tmp_path / "agent" / "pods" / created["metadata"]["uid"] / "jobfence.pid"
        container = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(),
                                 what="the container's pid"))
        os.kill(second_node["proc"].pid, signal.SIGKILL)  # the agent dies...
        wait_for(lambda: not processes.Started(container, 0, "").alive()
                 and not os.path.exists(f"/proc/{container}"),
                 what="its container gone with it")  # ...and its containers with it
        assert api.get(f"/api/v1/namespaces/{namespace}/pods/orphaned")["status"][
            "phase"] == "Running"  # nobody has said otherwise yet
        second_node["proc"] = processes.start(second_node["argv"], log=tmp_path / "again.log",
                                              env=second_node["env"], cwd=REPO)
        failed = phase_of(api, namespace, "orphaned", "Failed")
    [c] = failed["status"]["containerStatuses"]
    assert c["state"]["terminated"]["reason"] == "ContainerStatusUnknown"
    assert c["state"]["terminated"]["exitCode"] == 137


def test_kubectl_logs_reaches_the_containers_output_through_the_api_server(
        kube: ControlPlane, namespace: str) -> None:
    """The API server proxies pods/log to the node agent (its client certificate, the
    node's serving certificate): `kubectl logs`, `--tail` and `-f` until the end."""
    pod = pod_body("talker", labels={}, command=["sh", "-c", "echo one; sleep 1; echo two"])
    with kube.admin() as api:
        create(api, namespace, pod)
        phase_of(api, namespace, "talker", "Running", "Succeeded")
    followed = kube.run("-n", namespace, "logs", "-f", "talker")
    assert followed.returncode == 0 and followed.stdout == "one\ntwo\n", followed.stderr
    tail = kube.run("-n", namespace, "logs", "talker", "--tail=1")
    assert tail.stdout == "two\n"
    missing = kube.run("-n", namespace, "logs", "talker", "-c", "nothere")
    assert missing.returncode != 0


def test_a_failing_init_container_fails_the_pod_and_its_containers_never_start(
        kube: ControlPlane, namespace: str) -> None:
    pod = pod_body("init-fails", labels={}, command=["sh", "-c", "echo main ran"])
    pod["spec"]["initContainers"] = [restricted_container("setup", ["sh", "-c", "exit 4"])]
    with kube.admin() as api:
        created = create(api, namespace, pod)
        done = phase_of(api, namespace, "init-fails", "Failed", "Succeeded")
    assert done["status"]["phase"] == "Failed"
    [init] = done["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 4
    assert "main ran" not in kube.container_log(namespace, created)
