"""One suite for every cluster adapter that can be seeded with pods: the in-memory fake and
the real Kubernetes adapter against the real API server (the session's control plane,
tests/support/kube.py; its pods bound to a node no agent runs, their status written as that
node's kubelet would). Paging through more pods than a page holds, deletes that say whether
something went — and only what was listed (a uid precondition) — a pod's owner Job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from devtools.memory_cluster import MemoryCluster
from jobfence.adapters.kube import KubernetesCluster
from jobfence.cluster import Cluster, Pod
from tests.support.kube import WORKER_LABELS, ControlPlane, remote_pod, suspended_job

SELECTOR = "app.kubernetes.io/name=jobfence,app.kubernetes.io/component=worker"
INSTALLATION = "jf-test"
PAGE = 50
Seed = Callable[[str, str | None], dict[str, str | None]]
"""Seed a running worker pod (owned by a Job when one is named): its uid and its Job's."""


@pytest.fixture(params=["memory", "kubernetes"])
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[Cluster, Seed]]:
    if request.param == "memory":
        mem = MemoryCluster(page_size=PAGE)
        count = iter(range(1_000_000))

        def seed_mem(name: str, job: str | None) -> dict[str, str | None]:
            at = datetime(2026, 1, 1, tzinfo=UTC)
            uid, job_uid = f"uid-{next(count)}", f"job-uid-{job}" if job else None
            mem.add(Pod(name, "Running", created_at=at, started_at=at, job_name=job, uid=uid,
                        job_uid=job_uid))
            return {"uid": uid, "job_uid": job_uid}

        yield mem, seed_mem
        return
    kube: ControlPlane = request.getfixturevalue("kube")
    ns: str = request.getfixturevalue("namespace")
    api = kube.admin()
    jobs: dict[str, Any] = {}

    def seed_kube(name: str, job: str | None) -> dict[str, str | None]:
        owner = None
        if job:
            owner = jobs.get(job) or suspended_job(api, ns, job)
            jobs[job] = owner
        pod = remote_pod(api, ns, name, labels={**WORKER_LABELS,
                                                "jobfence.io/installation": INSTALLATION},
                         owner=owner)
        return {"uid": pod["metadata"]["uid"],
                "job_uid": owner["metadata"]["uid"] if owner else None}

    adapter = KubernetesCluster(namespace=ns, selector=SELECTOR, installation=INSTALLATION,
                                page_size=PAGE, cfg=kube.client_configuration())
    yield adapter, seed_kube
    api.close()


def test_pages_through_more_pods_than_one_page_holds(cluster: tuple[Cluster, Seed]) -> None:
    c, seed = cluster
    for i in range(2 * PAGE + 21):
        seed(f"worker-{i:05d}", None)
    pages = list(c.worker_pod_pages())
    assert [len(p) for p in pages] == [PAGE, PAGE, 21]
    names = [p.name for page in pages for p in page]
    assert len(set(names)) == 2 * PAGE + 21
    assert pages[0][0].phase == "Running"
    assert pages[0][0].started_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert all(p.uid for page in pages for p in page)


def test_empty_listing_is_one_empty_page_or_none(cluster: tuple[Cluster, Seed]) -> None:
    c, _ = cluster
    assert [p for page in c.worker_pod_pages() for p in page] == []


def test_delete_pod_says_whether_it_was_there(cluster: tuple[Cluster, Seed]) -> None:
    c, seed = cluster
    uid = seed("worker-1", None)["uid"]
    assert c.delete_pod("worker-1", uid=uid, grace_seconds=0) is True
    assert c.delete_pod("worker-1", uid=uid, grace_seconds=0) is False
    assert [p for page in c.worker_pod_pages() for p in page] == []


def test_a_delete_never_reaches_a_pod_that_took_the_name(cluster: tuple[Cluster, Seed]) -> None:
    """The listing saw one pod; by the time of the delete, another has its name: the uid
    precondition leaves the newcomer alone."""
    c, seed = cluster
    old = seed("worker-1", None)["uid"]
    assert c.delete_pod("worker-1", uid=old, grace_seconds=0) is True
    new = seed("worker-1", None)["uid"]
    assert new != old
    assert c.delete_pod("worker-1", uid=old, grace_seconds=0) is False
    assert [p.uid for page in c.worker_pod_pages() for p in page] == [new]


def test_delete_job_says_whether_it_was_there(cluster: tuple[Cluster, Seed]) -> None:
    c, seed = cluster
    job_uid = seed("worker-1", "sweeper-manual-1")["job_uid"]
    assert c.delete_job("sweeper-manual-1", uid="not-" + str(job_uid), grace_seconds=0) is False
    assert c.delete_job("sweeper-manual-1", uid=job_uid, grace_seconds=0) is True
    assert c.delete_job("sweeper-manual-1", uid=job_uid, grace_seconds=0) is False


def test_a_pod_knows_its_job(cluster: tuple[Cluster, Seed]) -> None:
    c, seed = cluster
    ids = seed("worker-1", "worker-job-1")
    [pod] = [p for page in c.worker_pod_pages() for p in page]
    assert (pod.job_name, pod.uid, pod.job_uid) == ("worker-job-1", ids["uid"], ids["job_uid"])
