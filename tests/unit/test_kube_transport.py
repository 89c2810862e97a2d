"""The Kubernetes adapter's transport, where a unit test needs faults on demand: against
the fake API server (kmock, devtools/kube_api.py) it retries throttling and server errors
with backoff and does not retry a refusal; the token bucket paces calls; a pod's JSON is
read as the functions need it. What the adapter does against a real API server — selectors,
paging, expired continue tokens, refusals by the real authorizer, uid preconditions — is
proven in tests/contract on the real control plane, not here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtools.kube_api import INSTALLATION, KubeAPI, kube_api, pod_object
from jobfence.adapters.kube import KubernetesCluster, TokenBucket, ended_badly, pod_from_json
from jobfence.errors import ClusterError

SELECTOR = "app.kubernetes.io/name=jobfence,app.kubernetes.io/component=worker"


@pytest.fixture
def api() -> Iterator[KubeAPI]:
    with kube_api() as a:
        yield a


def adapter(api: KubeAPI, page_size: int = 2) -> KubernetesCluster:
    return KubernetesCluster(namespace="jobs", selector=SELECTOR, installation=INSTALLATION,
                             page_size=page_size,
                             cfg=api.configuration())


def test_throttling_and_server_errors_are_retried_with_backoff(api: KubeAPI) -> None:
    for i in range(3):
        api.put("v1/pods", "jobs", pod_object(f"w-{i}"))
    api.emulator.list_faults = [429, 500, 503]
    pods = [p for page in adapter(api, page_size=10).worker_pod_pages() for p in page]
    assert len(pods) == 3
    assert len(api.emulator.list_calls) == 4  # each fault retried by the transport


def test_persistent_failure_raises_cluster_error(api: KubeAPI) -> None:
    api.emulator.list_faults = [503] * 10
    with pytest.raises(ClusterError, match="503"):
        list(adapter(api).worker_pod_pages())


def test_forbidden_is_not_retried(api: KubeAPI) -> None:
    api.emulator.list_faults = [403]
    with pytest.raises(ClusterError, match="403"):
        list(adapter(api).worker_pod_pages())
    assert len(api.emulator.list_calls) == 1


def test_pod_from_json_reads_phase_times_owner_and_deletion() -> None:
    obj = pod_object("w-1", phase="Failed", job="worker-abc",
                     started="2026-03-01T10:00:00Z")
    obj["metadata"]["deletionTimestamp"] = "2026-03-01T11:00:00Z"
    obj["metadata"]["uid"] = "pod-uid"
    pod = pod_from_json(obj)
    assert (pod.name, pod.phase, pod.job_name, pod.deleting) == (
        "w-1", "Failed", "worker-abc", True)
    assert (pod.uid, pod.job_uid) == ("pod-uid", "uid-worker-abc")
    assert pod.started_at is not None and pod.started_at.isoformat() == "2026-03-01T10:00:00+00:00"
    bare = pod_from_json({"metadata": {"name": "p"}})
    assert (bare.phase, bare.started_at, bare.job_name, bare.uid) == ("Pending", None, None,
                                                                      None)


def test_token_bucket_allows_a_burst_then_paces() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    bucket = TokenBucket(qps=10, burst=5, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        bucket.take()
    assert slept == []
    for _ in range(10):
        bucket.take()
    assert sum(slept) == pytest.approx(1.0, abs=0.01)  # 10 more calls at 10/s


def terminated(name: str, reason: str, code: int) -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"reason": reason, "exitCode": code}}}


def test_a_pod_that_ended_badly_says_why_a_sidecar_stopped_after_the_worker_does_not() -> None:
    oom = pod_from_json({"metadata": {"name": "w"}, "status": {
        "phase": "Failed",
        "initContainerStatuses": [terminated("command-runner", "Error", 143)],
        "containerStatuses": [terminated("jobfence", "OOMKilled", 137)]}})
    assert oom.reason == "jobfence: OOMKilled, exit 137"
    sidecar_oom = pod_from_json({"metadata": {"name": "w"}, "status": {
        "phase": "Failed",
        "initContainerStatuses": [terminated("command-runner", "OOMKilled", 137)],
        "containerStatuses": [terminated("jobfence", "Error", 1)]}})
    assert sidecar_oom.reason == "command-runner: OOMKilled, exit 137; jobfence: Error, exit 1"
    evicted = pod_from_json({"metadata": {"name": "w"}, "status": {
        "phase": "Failed", "reason": "Evicted", "containerStatuses": []}})
    assert evicted.reason == "Evicted"
    fine = pod_from_json({"metadata": {"name": "w"}, "status": {
        "phase": "Succeeded",
        "initContainerStatuses": [terminated("command-runner", "Error", 143)],
        "containerStatuses": [terminated("jobfence", "Completed", 0)]}})
    assert fine.reason is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner,
                                                                max_size=4), max_leaves=30)


@given(status=st.dictionaries(
    st.sampled_from(["reason", "initContainerStatuses", "containerStatuses", "phase", "x"]),
    json_values, max_size=5))
@settings(max_examples=300, deadline=None)
def test_any_status_gives_a_bounded_reason_or_none(status: dict[str, Any]) -> None:
    reason = ended_badly(status)
    assert reason is None or (isinstance(reason, str) and 0 < len(reason) <= 500)
