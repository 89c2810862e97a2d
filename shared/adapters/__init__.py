"""The adapters behind the ports, and the one place that builds the adapter a setting asks
for (``open_cluster``, ``open_object_store``). The adapters (``kube``, ``local_cluster``,
``s3``) are the only modules that import ``kubernetes`` or ``boto3``, and are imported here
on first use only, so that a function that needs neither never pays for them at start-up;
the ports (``jobfence.cluster``, ``jobfence.objectstore``) never import an adapter."""

from __future__ import annotations

from jobfence.cluster import Cluster
from jobfence.objectstore import ObjectStore
from jobfence.settings import Settings


def open_cluster(settings: Settings, installation: str) -> Cluster | None:
    """The adapter for ``JOBFENCE_CLUSTER``, seeing only ``installation``'s worker pods;
    None for ``none``."""
    if settings.cluster == "kubernetes":
        from jobfence.adapters.kube import KubernetesCluster

        return KubernetesCluster(namespace=settings.namespace,
                                 selector=settings.worker_selector, installation=installation,
                                 qps=settings.kube_qps, page_size=settings.kube_page_size)
    if settings.cluster == "local":
        from jobfence.adapters.local_cluster import LocalCluster

        return LocalCluster(installation)
    return None


def open_object_store(settings: Settings) -> ObjectStore:
    """The S3 adapter for these settings."""
    from jobfence.adapters.s3 import S3ObjectStore

    return S3ObjectStore(endpoint_url=settings.s3_endpoint_url, region=settings.s3_region,
                         access_key_id=settings.s3_access_key_id,
                         secret_access_key=settings.s3_secret_access_key)
