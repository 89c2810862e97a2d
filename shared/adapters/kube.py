"""The cluster port over the official ``kubernetes`` client.

In-cluster configuration when running in a pod, else the local kubeconfig. Lists are paged
with ``limit``/``continue`` and read as raw JSON (no model objects: a page of 500 pods stays
small). Throttling (429), server errors (5xx) and dropped connections are retried by the
client's own transport — urllib3's ``Retry``, given through the client's configuration:
exponential backoff with jitter, honouring ``Retry-After`` — and a client-side token bucket
keeps a pass from flooding the API server. What still fails is a ``ClusterError``; an
expired ``continue`` token (410) means the listing cannot be completed, and the caller
changes nothing.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError
from urllib3.util.retry import Retry

from jobfence.cluster import (
    INSTALLATION_LABEL,
    POD_NAME_PATTERN,
    ClusterError,
    Identity,
    Pod,
    cronjob_name,
)

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


def retries(max_attempts: int = 6, backoff: float = 0.2) -> Retry:
    """What the client's transport retries: throttling and server errors (honouring
    ``Retry-After``), connection and read errors, with exponential backoff and jitter. The
    last answer is returned rather than raised, so that the client reports its status."""
    return Retry(total=max_attempts - 1, status_forcelist=sorted(RETRY_STATUSES),
                 allowed_methods=None, backoff_factor=backoff, backoff_max=10.0,
                 backoff_jitter=backoff, respect_retry_after_header=True,
                 raise_on_status=False)


def configuration(retry: Retry | None = None) -> client.Configuration:
    """In-cluster configuration when running in a pod, else the local kubeconfig, with the
    transport's retries."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        try:
            config.load_kube_config(client_configuration=cfg)
        except (config.ConfigException, OSError) as exc:
            raise ClusterError(f"no Kubernetes configuration (in-cluster or kubeconfig): "
                               f"{exc}") from exc
    cfg.retries = retry or retries()
    return cfg


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def installation_selector(selector: str, installation: str) -> str:
    """``selector`` narrowed to one installation's pods, whatever it says: the installation
    label is added here, so a hand-edited selector cannot drop it (and one that names
    another installation selects nothing)."""
    terms = [t.strip() for t in selector.split(",") if t.strip()]
    return ",".join([*terms, f"{INSTALLATION_LABEL}={installation}"])


def pod_from_json(obj: dict[str, Any]) -> Pod:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    owner: dict[str, Any] = next((o for o in meta.get("ownerReferences") or []
                                  if o.get("kind") == "Job"), {})
    return Pod(name=meta["name"], phase=status.get("phase") or "Pending",
               created_at=_time(meta.get("creationTimestamp")),
               started_at=_time(status.get("startTime")), job_name=owner.get("name"),
               deleting=meta.get("deletionTimestamp") is not None, uid=meta.get("uid"),
               job_uid=owner.get("uid"), reason=ended_badly(status))


def ended_badly(status: dict[str, Any]) -> str | None:
    """Why a pod ended, if it did not end well: its own reason (``Evicted``...) and each
    container terminated with a reason other than Completed or a non-zero exit code
    (``jobfence: OOMKilled, exit 137``); None when nothing ended badly."""
    parts = [str(status["reason"])] if status.get("reason") else []
    # A sidecar (an init container that keeps running) is stopped by the kubelet once the
    # worker ended, whatever its exit code: only its being OOMKilled is news.
    listed = [(c, sidecar) for key, sidecar in (("initContainerStatuses", True),
                                                ("containerStatuses", False))
              for c in _dicts(status.get(key))]
    for c, sidecar in listed:
        ended = _dict(_dict(c.get("state")).get("terminated"))
        reason, code = ended.get("reason"), ended.get("exitCode")
        if ended and (reason == "OOMKilled" or (not sidecar and (
                reason not in (None, "Completed") or code not in (None, 0)))):
            parts.append(f"{c.get('name')}: {reason or 'Error'}, exit {code}")
    return "; ".join(parts)[:500] or None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def delete_options(uid: str | None, grace_seconds: int,
                   propagation: str | None = None) -> dict[str, Any]:
    """DeleteOptions with the object's uid as a precondition: the server deletes that
    object or nothing (409 when the name belongs to another one now)."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions",
                            "gracePeriodSeconds": grace_seconds}
    if uid:
        body["preconditions"] = {"uid": uid}
    if propagation:
        body["propagationPolicy"] = propagation
    return body


def manual_job(cron: dict[str, Any], *, requested_by: str, reason: str,
               now: datetime) -> dict[str, Any]:
    """The Job a manual trigger creates from a CronJob: its template, owned by the CronJob
    (its concurrency policy and history then cover it), named after it and the time (at
    most one trigger a minute per function), every container told who asked and why."""
    meta = cron["metadata"]
    template = copy.deepcopy(cron["spec"]["jobTemplate"])
    tmeta = template.get("metadata") or {}
    spec = template["spec"]
    told = [{"name": "JOBFENCE_TRIGGERED_BY", "value": requested_by},
            {"name": "JOBFENCE_TRIGGER_REASON", "value": reason},
            {"name": "JOBFENCE_TRIGGER", "value": "manual"}]
    for container in spec["template"]["spec"]["containers"]:
        keep = [e for e in container.get("env") or [] if e["name"] not in
                {t["name"] for t in told}]
        container["env"] = [*keep, *told]
    annotations = {**(tmeta.get("annotations") or {}),
                   "cronjob.kubernetes.io/instantiate": "manual",
                   "jobfence.io/triggered-by": requested_by[:200],
                   "jobfence.io/trigger-reason": reason[:2000]}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{meta['name'][:40]}-manual-{now:%Y%m%d%H%M%S}",
                         "labels": dict(tmeta.get("labels") or {}),
                         "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob",
                                              "name": meta["name"], "uid": meta.get("uid", ""),
                                              "controller": True}]},
            "spec": spec}


class KubernetesCluster:
    claimer_pattern = POD_NAME_PATTERN

    def __init__(self, *, namespace: str, selector: str, installation: str,
                 qps: float = 20.0, page_size: int = 500,
                 cfg: client.Configuration | None = None) -> None:
        self.namespace, self.page_size = namespace, page_size
        self.selector = installation_selector(selector, installation)
        self.api_client = client.ApiClient(cfg or configuration())
        self.core = client.CoreV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self.auth = client.AuthenticationV1Api(self.api_client)
        self.bucket = TokenBucket(qps, max(1, int(qps * 2)))

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

    def delete_pod(self, name: str, *, uid: str | None, grace_seconds: int) -> bool:
        return self._delete(lambda: self.core.delete_namespaced_pod(
            name, self.namespace, body=delete_options(uid, grace_seconds),
            _preload_content=False), f"pod {name}")

    def delete_job(self, name: str, *, uid: str | None, grace_seconds: int) -> bool:
        return self._delete(lambda: self.batch.delete_namespaced_job(
            name, self.namespace, body=delete_options(uid, grace_seconds, "Background"),
            _preload_content=False), f"job {name}")

    def trigger(self, function: str, *, requested_by: str, reason: str) -> str:
        """A Job from the function's CronJob, as ``kubectl create job --from=cronjob/...``
        makes one (owned by the CronJob), its run told who asked and why."""
        name = cronjob_name(function)
        cron = self._read(lambda: self.batch.read_namespaced_cron_job(
            name, self.namespace, _preload_content=False), f"cronjob {name}")
        if cron is None:
            raise ClusterError(f"no CronJob {name} in namespace {self.namespace}")
        job = manual_job(cron, requested_by=requested_by, reason=reason,
                         now=datetime.now(UTC))
        try:
            made = self._json(lambda: self.batch.create_namespaced_job(
                self.namespace, job, _preload_content=False))
        except ApiException as exc:
            raise ClusterError(f"creating a Job from {name} failed: HTTP {exc.status} "
                               f"{exc.reason}") from exc
        return str(made["metadata"]["name"])

    def review_token(self, token: str) -> Identity | None:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token}}
        try:
            answer = self._json(lambda: self.auth.create_token_review(
                review, _preload_content=False))
        except ApiException as exc:
            raise ClusterError(f"reviewing a token failed: HTTP {exc.status} "
                               f"{exc.reason}") from exc
        status = answer.get("status") or {}
        user = status.get("user") or {}
        if not status.get("authenticated") or not user.get("username"):
            return None
        return Identity(str(user["username"]), tuple(str(g) for g in user.get("groups") or ()))

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
            if exc.status in (404, 409):  # gone, or the name is another object's now
                return False
            raise ClusterError(f"deleting {what} failed: HTTP {exc.status} {exc.reason}") from exc
        return True

    def _json(self, call: Callable[[], Any]) -> dict[str, Any]:
        resp = self._call(call)
        data: dict[str, Any] = json.loads(resp.data)
        return data

    def _call(self, call: Callable[[], T]) -> T:
        """Call with the rate limit (the transport retries). API errors (404, 410, 403...)
        are the caller's to interpret; a connection that stays down is a ClusterError."""
        self.bucket.take()
        try:
            return call()
        except HTTPError as exc:
            raise ClusterError(f"Kubernetes API unreachable: {exc}") from exc
