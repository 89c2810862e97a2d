"""One suite for every cluster adapter that can be seeded with pods: the in-memory fake and
the real Kubernetes adapter talking HTTP to a fake API server (tests/kube_api.py). Paging
through more pods than a page holds, deletes that say whether something went, a Job's
annotations and a pod's owner Job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from devtools.kube_api import INSTALLATION, KubeAPI, kube_api, pod_object
from devtools.memory_cluster import MemoryCluster
from jobfence.adapters.kube import KubernetesCluster
from jobfence.cluster import Cluster, Pod

SELECTOR = "app.kubernetes.io/name=jobfence,app.kubernetes.io/component=worker"
Seed = Callable[[str, str | None, dict[str, str] | None], None]


@pytest.fixture(scope="module")
def api() -> Iterator[KubeAPI]:
    with kube_api() as a:
        yield a


_namespaces = iter(range(10_000))


@pytest.fixture(params=["memory", "kubernetes"])
def cluster(request: pytest.FixtureRequest, api: KubeAPI) -> tuple[Cluster, Seed]:
    if request.param == "memory":
        mem = MemoryCluster(page_size=500)

        def seed_mem(name: str, job: str | None, annotations: dict[str, str] | None) -> None:
            at = datetime(2026, 1, 1, tzinfo=UTC)
            mem.add(Pod(name, "Running", created_at=at, started_at=at, job_name=job))
            if job:
                mem.jobs[job] = annotations or {}

        return mem, seed_mem
    ns = f"ns-{next(_namespaces)}"  # a namespace per test keeps the shared server clean

    def seed_kube(name: str, job: str | None, annotations: dict[str, str] | None) -> None:
        api.put("v1/pods", ns, pod_object(name, namespace=ns, job=job))
        if job:
            api.put("batch/v1/jobs", ns, {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": job, "namespace": ns, "annotations": annotations or {}}})

    kube = KubernetesCluster(namespace=ns, selector=SELECTOR, installation=INSTALLATION,
                             page_size=500,
                             cfg=api.configuration())
    return kube, seed_kube


def test_pages_through_more_pods_than_one_page_holds(cluster: tuple[Cluster, Seed]) -> None:
    c, seed = cluster
    for i in range(1_201):
        seed(f"worker-{i:05d}", None, None)
    pages = list(c.worker_pod_pages())
    assert [len(p) for p in pages] == [500, 500, 201]
    names = [p.name for page in pages for p in page]
    assert len(set(names)) == 1_201
    assert pages[0][0].phase == "Running"
    assert pages[0][0].started_at == datetime(2026, 1, 1, tzinfo=UTC)


def test_empty_listing_is_one_empty_page_or_none(cluster: tuple[Cluster, Seed]) -> None:
    c, _ = cluster
    assert [p for page in c.worker_pod_pages() for p in page] == []


def test_delete_pod_says_whether_it_was_there(cluster: tuple[Cluster, Seed]) -> None:
    c, seed = cluster
    seed("worker-1", None, None)
    assert c.delete_pod("worker-1", grace_seconds=0) is True
    assert c.delete_pod("worker-1", grace_seconds=0) is False
    assert [p for page in c.worker_pod_pages() for p in page] == []


def test_delete_job_says_whether_it_was_there(cluster: tuple[Cluster, Seed]) -> None:
    c, seed = cluster
    seed("worker-1", "sweeper-manual-1", {"cronjob.kubernetes.io/instantiate": "manual"})
    assert c.delete_job("sweeper-manual-1", grace_seconds=0) is True
    assert c.delete_job("sweeper-manual-1", grace_seconds=0) is False
