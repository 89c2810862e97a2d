"""The session's node is a real one: containerd and runc run the pods a kubelet built from
the pinned Kubernetes is given, from the image imported into containerd, in the cluster's
own network namespace. Its Node says so; a pod of the image, admitted under the
``restricted`` Pod Security level, runs as the image's numeric user with tini as PID 1 and
a root filesystem that refuses writes; ``kubectl logs`` and ``exec`` go through the
kubelet; a missing image is ``ImagePullBackOff``, explained by the pod's events.
(With ``JOBFENCE_TEST_NODE=kubelet``; the session's node is the node agent otherwise.)"""

from __future__ import annotations

from typing import Any

import pytest

from devtools import controlplane
from tests.kube import NODE, REAL_NODE, ControlPlane, pod_body, wait_for

pytestmark = pytest.mark.skipif(
    not REAL_NODE, reason="the session's node is the node agent (JOBFENCE_TEST_NODE=kubelet "
                          "runs it on a real kubelet)")


def phase_of(kube: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    with kube.admin() as api:
        pod: dict[str, Any] = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod


def test_the_node_is_a_ready_kubelet_on_containerd(kube: ControlPlane) -> None:
    with kube.admin() as api:
        node = api.get(f"/api/v1/nodes/{NODE}")
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://1."), info
    assert info["kubeletVersion"] == controlplane.KUBERNETES
    assert not node["spec"].get("taints")  # the registration taint lifted
    assert [a["address"] for a in node["status"]["addresses"]
            if a["type"] == "InternalIP"] == ["10.244.0.1"]


def test_a_pod_of_the_image_runs_restricted_with_logs_and_exec(
        kube: ControlPlane, namespace: str) -> None:
    body = pod_body("shell", labels={"app": "t"},
                    command=["sh", "-c", "echo started as $(id -u); exec sleep 600"])
    body["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = True
    body["spec"]["containers"][0]["command"] = ["/usr/bin/tini", "--",
                                                *body["spec"]["containers"][0]["command"]]
    with kube.admin() as api:
        api.post(f"/api/v1/namespaces/{namespace}/pods", body)
    wait_for(lambda: phase_of(kube, namespace, "shell")["status"].get("phase") == "Running",
             what="the pod running", timeout=120)
    logs = wait_for(lambda: kube.run("-n", namespace, "logs", "shell").stdout,
                    what="kubectl logs", timeout=30)
    assert logs.strip() == "started as 10001"
    exec_ = kube.run("-n", namespace, "exec", "shell", "--", "sh", "-c",
                     "id -u; tr '\\0' ' ' </proc/1/cmdline; echo; touch /written || true")
    assert exec_.returncode == 0, exec_.stderr
    uid, pid1 = exec_.stdout.splitlines()[:2]
    assert uid == "10001"
    assert pid1.split()[0] == "/usr/bin/tini"
    assert "Read-only file system" in exec_.stderr


def test_an_image_that_does_not_exist_is_image_pull_back_off_with_its_reason(
        kube: ControlPlane, namespace: str) -> None:
    body = pod_body("missing", labels={"app": "t"})
    body["spec"]["containers"][0]["image"] = "localhost/jobfence:no-such-version"
    with kube.admin() as api:
        api.post(f"/api/v1/namespaces/{namespace}/pods", body)

    def waiting() -> str:
        statuses = phase_of(kube, namespace, "missing")["status"].get("containerStatuses")
        return statuses[0]["state"].get("waiting", {}).get("reason", "") if statuses else ""

    wait_for(lambda: waiting() in ("ErrImagePull", "ImagePullBackOff"),
             what="the pull refused", timeout=120)
    assert phase_of(kube, namespace, "missing")["status"]["phase"] == "Pending"
    events = kube.run("-n", namespace, "get", "events", "--field-selector",
                      "involvedObject.name=missing", "-o", "jsonpath={.items[*].message}")
    assert "localhost/jobfence:no-such-version" in events.stdout, events.stdout
