"""The cluster port over the official ``kubernetes`` client.

In-cluster configuration when running in a pod, else the local kubeconfig. Lists are paged
with ``limit``/``continue`` and read as raw JSON (no model objects: a page of 500 pods stays
small); throttling (429) and server errors (5xx) are retried with exponential backoff and
jitter, honouring ``Retry-After``; a client-side token bucket keeps a pass from flooding the
API server. An expired ``continue`` token (410) means the listing cannot be completed:
``ClusterError``, and the caller changes nothing.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from jobfence.cluster import POD_NAME_PATTERN, ClusterError, Pod
from jobfence.logs import get_logger

log = get_logger("jobfence.kube")
T = TypeVar("T")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class TokenBucket:
    """At most ``qps`` calls per second on average, bursts up to ``burst``."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.qps, self.burst = qps, burst
        self.clock, self.sleep = clock, sleep
        self.tokens = float(burst)
        self.stamp = clock()
        self.lock = threading.Lock()

    def take(self) -> None:
        with self.lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.qps)
            self.stamp = now
            self.tokens -= 1
            wait = -self.tokens / self.qps if self.tokens < 0 else 0.0
        if wait > 0:
            self.sleep(wait)


def _load_api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise ClusterError(f"no Kubernetes configuration (in-cluster or kubeconfig): "
                               f"{exc}") from exc
    return client.ApiClient()


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def pod_from_json(obj: dict[str, Any]) -> Pod:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    owner = next((o["name"] for o in meta.get("ownerReferences") or []
                  if o.get("kind") == "Job"), None)
    return Pod(name=meta["name"], phase=status.get("phase") or "Pending",
               created_at=_time(meta.get("creationTimestamp")),
               started_at=_time(status.get("startTime")), job_name=owner,
               deleting=meta.get("deletionTimestamp") is not None)


class KubernetesCluster:
    claimer_pattern = POD_NAME_PATTERN

    def __init__(self, *, namespace: str, selector: str, qps: float = 20.0,
                 page_size: int = 500, api_client: client.ApiClient | None = None,
                 max_attempts: int = 6, backoff_base: float = 0.2,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.namespace, self.selector, self.page_size = namespace, selector, page_size
        self.api_client = api_client or _load_api_client()
        self.core = client.CoreV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self.bucket = TokenBucket(qps, max(1, int(qps * 2)), sleep=sleep)
        self.max_attempts, self.backoff_base, self.sleep = max_attempts, backoff_base, sleep

    # -- the port --------------------------------------------------------------------------

    def worker_pod_pages(self) -> Iterator[list[Pod]]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"label_selector": self.selector, "limit": self.page_size}
            if token:
                kwargs["_continue"] = token
            try:
                page = self._json(lambda kw=kwargs: self.core.list_namespaced_pod(  # type: ignore[misc]
                    self.namespace, _preload_content=False, **kw))
            except ApiException as exc:
                what = ("the listing expired part-way (410 Gone)" if exc.status == 410
                        else f"HTTP {exc.status} {exc.reason}")
                raise ClusterError(f"listing worker pods failed: {what}") from exc
            yield [pod_from_json(item) for item in page.get("items") or []]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    def delete_pod(self, name: str, *, grace_seconds: int) -> bool:
        return self._delete(lambda: self.core.delete_namespaced_pod(
            name, self.namespace, grace_period_seconds=grace_seconds,
            _preload_content=False), f"pod {name}")

    def delete_job(self, name: str, *, grace_seconds: int) -> bool:
        return self._delete(lambda: self.batch.delete_namespaced_job(
            name, self.namespace, grace_period_seconds=grace_seconds,
            propagation_policy="Background", _preload_content=False), f"job {name}")

    def job_annotations(self, name: str) -> dict[str, str] | None:
        obj = self._read(lambda: self.batch.read_namespaced_job(
            name, self.namespace, _preload_content=False), f"job {name}")
        if obj is None:
            return None
        return dict((obj.get("metadata") or {}).get("annotations") or {})

    def pod_job_name(self, name: str) -> str | None:
        obj = self._read(lambda: self.core.read_namespaced_pod(
            name, self.namespace, _preload_content=False), f"pod {name}")
        return pod_from_json(obj).job_name if obj else None

    # -- calls with rate limit and retries -------------------------------------------------

    def _read(self, call: Callable[[], Any], what: str) -> dict[str, Any] | None:
        try:
            return self._json(call)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ClusterError(f"reading {what} failed: HTTP {exc.status} {exc.reason}") from exc

    def _delete(self, call: Callable[[], Any], what: str) -> bool:
        try:
            self._call(call)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise ClusterError(f"deleting {what} failed: HTTP {exc.status} {exc.reason}") from exc
        return True

    def _json(self, call: Callable[[], Any]) -> dict[str, Any]:
        resp = self._call(call)
        data: dict[str, Any] = json.loads(resp.data)
        return data

    def _call(self, call: Callable[[], T]) -> T:
        """Call with the rate limit; retry 429/5xx and connection errors with backoff.
        Other API errors (404, 410, 403...) are the caller's to interpret."""
        attempt = 0
        while True:
            attempt += 1
            self.bucket.take()
            try:
                return call()
            except ApiException as exc:
                if exc.status not in RETRY_STATUSES or attempt >= self.max_attempts:
                    raise
                delay = self._retry_after(exc) or self._backoff(attempt)
                log.warning("kube_retry", status=exc.status, attempt=attempt,
                            delay_seconds=round(delay, 3))
            except HTTPError as exc:
                if attempt >= self.max_attempts:
                    raise ClusterError(f"Kubernetes API unreachable: {exc}") from exc
                delay = self._backoff(attempt)
                log.warning("kube_retry", error=str(exc), attempt=attempt,
                            delay_seconds=round(delay, 3))
            self.sleep(delay)

    def _backoff(self, attempt: int) -> float:
        d: float = min(10.0, self.backoff_base * 2.0 ** (attempt - 1))
        return d / 2 + random.uniform(0, d / 2)  # noqa: S311 (jitter, not crypto)

    @staticmethod
    def _retry_after(exc: ApiException) -> float | None:
        value = str((exc.headers or {}).get("Retry-After") or "")
        try:
            return min(30.0, float(value)) if value else None
        except ValueError:
            return None
