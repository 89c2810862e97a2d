"""The session's node is a real one: containerd and runc run the pods a kubelet built from
the pinned Kubernetes is given, from the image imported into containerd, in the cluster's
own network namespace. Its Node says so; a pod of the image, admitted under the
``restricted`` Pod Security level, runs as the image's numeric user with tini as PID 1 and
a root filesystem that refuses writes, seccomp in force and no capability; ``kubectl
logs``, ``exec`` and ``port-forward`` go through the kubelet; a missing image is
``ImagePullBackOff``, explained by the pod's events. The shipped worker pod runs its
worker as 10001 and its job's command as 10002, each under tini, and the kernel holds a
command to its container's memory limit."""

from __future__ import annotations

import subprocess
import urllib.request
from typing import Any

from devtools import controlplane
from tests.support.kube import NODE, ControlPlane, enqueue_command, install, pod_body, wait_for


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
                     "id -u; tr '\\0' ' ' </proc/1/cmdline; echo; "
                     "grep -E '^(Seccomp|CapEff|NoNewPrivs):' /proc/self/status; "
                     "touch /written || true")
    assert exec_.returncode == 0, exec_.stderr
    uid, pid1, *status = exec_.stdout.splitlines()
    assert uid == "10001"
    assert pid1.split()[0] == "/usr/bin/tini"
    fields = dict(line.split(":\t", 1) for line in status)
    # seccomp RuntimeDefault in force (mode 2: a filter), no capability, no privilege gain
    assert fields == {"Seccomp": "2", "CapEff": "0000000000000000", "NoNewPrivs": "1"}, fields
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


def test_a_worker_pod_runs_the_worker_as_10001_and_its_command_as_10002_under_tini(
        kube: ControlPlane, namespace: str, dsn: str) -> None:
    """The shipped worker pod, as KEDA makes it: the command sidecar (a native sidecar) runs
    the job's command as 10002 beside the worker (10001), each container under tini, each
    root filesystem read-only, every container with requests and limits."""
    inst = install(kube, namespace, dsn)
    job_id = enqueue_command(dsn, ["sh", "-c", "echo uid=$(id -u); "
                                   "echo pid1=$(tr '\\0' ' ' </proc/1/cmdline); "
                                   "touch /written 2>/dev/null || echo read-only; sleep 5"])
    inst.worker_job("worker-ids")
    pod = inst.claiming_pod(job_id, "worker-ids")
    exec_ = kube.run("-n", namespace, "exec", pod["metadata"]["name"], "-c", "jobfence", "--",
                     "sh", "-c", "id -u; tr '\\0' ' ' </proc/1/cmdline")
    assert exec_.returncode == 0, exec_.stderr
    uid, pid1 = exec_.stdout.splitlines()
    assert (uid, pid1.split()[:3]) == ("10001", ["/usr/bin/tini", "--", "jobfence"])
    done = inst.wait_status(job_id, "succeeded", "failed", timeout=120)
    [result] = inst.sql("SELECT result, error FROM job_action_results WHERE job_id = %s",
                        job_id)
    assert done["status"] == "succeeded", inst.story(job_id)
    out = result["result"]["stdout_tail"].split()
    assert out[0] == "uid=10002", out
    assert out[1:4] == ["pid1=/usr/bin/tini", "--", "jobfence"], out  # the sidecar's tini
    assert out[-1] == "read-only", out
    spec = pod["spec"]
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]


def test_a_command_past_its_containers_memory_limit_is_killed_and_said_so_then_retried(
        kube: ControlPlane, namespace: str, dsn: str) -> None:
    """The kernel enforces the command sidecar's memory limit (here 192Mi instead of the
    shipped 1Gi): a command that touches more is killed by the out-of-memory killer, and the
    attempt fails saying so — not "exited with -9" — then the job is retried by its policy
    and fails for good on its last attempt; nothing is left running or stuck."""
    inst = install(kube, namespace, dsn)
    job_id = enqueue_command(
        dsn, ["python3", "-c", "b = b'x' * (512 * 2**20); print(len(b))"], max_attempts=2)
    with kube.admin() as api:
        scaled = api.get(f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledjobs/"
                         "jobfence-worker-default")
    template = scaled["spec"]["jobTargetRef"]["template"]
    [runner] = template["spec"]["initContainers"]
    runner["resources"]["limits"]["memory"] = "192Mi"
    runner["resources"]["requests"]["memory"] = "192Mi"
    # One job per pod (the default pool): a pod per attempt, as KEDA would start them.
    inst.worker_job("worker-oom-1", template=template)
    inst.wait_status(job_id, "pending", "failed", attempts=1)
    inst.worker_job("worker-oom-2", template=template)
    inst.wait_status(job_id, "failed")
    [row] = inst.sql("SELECT status, attempt_count, error FROM jobs WHERE job_id = %s", job_id)
    assert (row["status"], row["attempt_count"]) == ("failed", 2), row
    assert "out-of-memory killer" in row["error"] and "192 MiB" in row["error"], row["error"]
    results = inst.sql("SELECT error, result FROM job_action_results WHERE job_id = %s "
                       "ORDER BY finished_at", job_id)
    assert len(results) == 2
    for r in results:
        assert r["result"]["usage"]["oom_killed"] is True, r
        assert r["result"]["usage"]["memory_limit_bytes"] == 192 * 2**20, r


def test_port_forward_reaches_a_pod_through_the_kubelet(
        kube: ControlPlane, namespace: str) -> None:
    body = pod_body("web", labels={"app": "t"},
                    command=["python3", "-m", "http.server", "8080", "--directory", "/etc"])
    with kube.admin() as api:
        api.post(f"/api/v1/namespaces/{namespace}/pods", body)
    wait_for(lambda: phase_of(kube, namespace, "web")["status"].get("phase") == "Running",
             what="the pod running", timeout=120)
    forward = subprocess.Popen(
        [str(kube.kubectl), "--kubeconfig", str(kube.kubeconfig), "-n", namespace,
         "port-forward", "pod/web", ":8080"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8080"
        port = int(line.split("127.0.0.1:")[1].split()[0])

        def fetched() -> str:
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/hostname", timeout=5) as resp:
                    return str(resp.read().decode())
            except OSError:
                return ""

        assert wait_for(fetched, what="an answer through port-forward", timeout=30).strip() \
            == "web"
    finally:
        forward.kill()
        forward.communicate(timeout=10)  # its pipes closed
