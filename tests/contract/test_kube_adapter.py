"""The Kubernetes adapter's own behaviour over HTTP against the fake API server: it sends
the label selector and page size, retries throttling and server errors with backoff, and
turns a listing that cannot be completed (an expired continue token, a refusal) into
ClusterError so that no pass acts on half a picture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devtools.kube_api import INSTALLATION, KubeAPI, kube_api, pod_object
from jobfence.adapters.kube import KubernetesCluster, TokenBucket, pod_from_json
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


def test_lists_only_worker_pods_with_selector_and_limit(api: KubeAPI) -> None:
    api.put("v1/pods", "jobs", pod_object("w-1"))
    api.put("v1/pods", "jobs", pod_object("web-1", labels={"app": "web"}))
    api.put("v1/pods", "other", pod_object("w-2", namespace="other"))
    names = [p.name for page in adapter(api).worker_pod_pages() for p in page]
    assert names == ["w-1"]
    assert api.emulator.list_calls[0] == {
        "labelSelector": f"{SELECTOR},jobfence.io/installation={INSTALLATION}", "limit": "2"}


def test_the_selector_always_names_the_installation(api: KubeAPI) -> None:
    """Two installations' worker pods in one namespace: each adapter lists only its own,
    whatever selector it was configured with — even one that names the other."""
    api.put("v1/pods", "jobs", pod_object("mine", installation="prod"))
    api.put("v1/pods", "jobs", pod_object("theirs", installation="staging"))
    api.put("v1/pods", "jobs", pod_object("unlabelled", labels={
        "app.kubernetes.io/name": "jobfence", "app.kubernetes.io/component": "worker"}))
    for selector in (SELECTOR, "app.kubernetes.io/component=worker",
                     f"{SELECTOR},jobfence.io/installation=staging"):
        prod = KubernetesCluster(namespace="jobs", selector=selector, installation="prod",
                                 cfg=api.configuration())
        names = {p.name for page in prod.worker_pod_pages() for p in page}
        assert names <= {"mine"}, (selector, names)
    prod = KubernetesCluster(namespace="jobs", selector=SELECTOR, installation="prod",
                             cfg=api.configuration())
    assert [p.name for page in prod.worker_pod_pages() for p in page] == ["mine"]


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


def test_expired_continue_token_means_incomplete_listing(api: KubeAPI) -> None:
    for i in range(5):
        api.put("v1/pods", "jobs", pod_object(f"w-{i}"))
    api.emulator.expire_continue = True
    pages = adapter(api).worker_pod_pages()
    assert len(next(pages)) == 2
    with pytest.raises(ClusterError, match="410"):
        next(pages)


def test_pod_from_json_reads_phase_times_owner_and_deletion() -> None:
    obj = pod_object("w-1", phase="Failed", job="worker-abc",
                     started="2026-03-01T10:00:00Z")
    obj["metadata"]["deletionTimestamp"] = "2026-03-01T11:00:00Z"
    pod = pod_from_json(obj)
    assert (pod.name, pod.phase, pod.job_name, pod.deleting) == (
        "w-1", "Failed", "worker-abc", True)
    assert pod.started_at is not None and pod.started_at.isoformat() == "2026-03-01T10:00:00+00:00"
    bare = pod_from_json({"metadata": {"name": "p"}})
    assert (bare.phase, bare.started_at, bare.job_name) == ("Pending", None, None)


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
