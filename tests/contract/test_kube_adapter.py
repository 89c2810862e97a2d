"""The Kubernetes adapter against the real API server: the label selector and page size it
sends are evaluated by the server (``limit``/``continue`` followed to the end), it sees only
its installation's worker pods whatever selector it is configured with, and a listing that
cannot be completed — a continue token expired by an etcd compaction (410 Gone) — is a
ClusterError, so that no pass acts on half a picture. (Refusals by the real authorizer:
tests/cluster/test_rbac.py; the transport's retries on faults in front of the real server:
tests/contract/test_kube_faults.py.)"""

from __future__ import annotations

import pytest

from devtools.cluster.rest import ApiError
from jobfence.adapters.kube import KubernetesCluster
from jobfence.errors import ClusterError
from tests.support.kube import WORKER_LABELS, ControlPlane, compact_etcd, remote_pod, wait_for

SELECTOR = "app.kubernetes.io/name=jobfence,app.kubernetes.io/component=worker"


def adapter(kube: ControlPlane, namespace: str, installation: str = "prod",
            selector: str = SELECTOR, page_size: int = 2) -> KubernetesCluster:
    return KubernetesCluster(namespace=namespace, selector=selector,
                             installation=installation, page_size=page_size,
                             cfg=kube.client_configuration())


def seed(kube: ControlPlane, namespace: str) -> None:
    with kube.admin() as api:
        for i in range(5):
            remote_pod(api, namespace, f"mine-{i}",
                       labels={**WORKER_LABELS, "jobfence.io/installation": "prod"})
        for i in range(2):
            remote_pod(api, namespace, f"theirs-{i}",
                       labels={**WORKER_LABELS, "jobfence.io/installation": "staging"})
        remote_pod(api, namespace, "unlabelled", labels=WORKER_LABELS)
        remote_pod(api, namespace, "web-1", labels={"app": "web",
                                                    "jobfence.io/installation": "prod"})


def test_lists_only_its_worker_pods_a_page_at_a_time(kube: ControlPlane,
                                                     namespace: str) -> None:
    seed(kube, namespace)
    pages = list(adapter(kube, namespace).worker_pod_pages())
    assert [len(p) for p in pages] == [2, 2, 1]
    assert sorted(p.name for page in pages for p in page) == [f"mine-{i}" for i in range(5)]


@pytest.mark.parametrize("selector", [
    SELECTOR, "app.kubernetes.io/component=worker",
    f"{SELECTOR},jobfence.io/installation=staging"])
def test_the_selector_always_names_the_installation(kube: ControlPlane, namespace: str,
                                                    selector: str) -> None:
    """Two installations' worker pods in one namespace: whatever selector an installation's
    adapter is configured with — even one that names the other — it lists only its own."""
    seed(kube, namespace)
    names = {p.name for page in adapter(kube, namespace, selector=selector).worker_pod_pages()
             for p in page}
    assert names <= {f"mine-{i}" for i in range(5)}, names


def test_an_expired_continue_token_means_an_incomplete_listing(kube: ControlPlane,
                                                              namespace: str) -> None:
    seed(kube, namespace)
    with kube.admin() as api:
        listed_at = api.get(f"/api/v1/namespaces/{namespace}/pods", limit=1)[
            "metadata"]["resourceVersion"]
        pages = adapter(kube, namespace).worker_pod_pages()
        assert len(next(pages)) == 2
        # A write after the listing began, then a compaction past it, as the API server
        # makes every five minutes; its watch cache learns of it within seconds.
        api.post(f"/api/v1/namespaces/{namespace}/configmaps",
                 {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tick"}})
        compact_etcd(kube)

        def expired() -> bool:
            try:
                api.get(f"/api/v1/namespaces/{namespace}/pods", limit=1,
                        resourceVersion=listed_at, resourceVersionMatch="Exact")
            except ApiError as exc:
                return exc.status == 410
            return False

        wait_for(expired, what="the compaction seen by the API server", timeout=60)
    with pytest.raises(ClusterError, match="410"):
        next(pages)
