"""A fake Kubernetes API server over HTTP for the real ``kubernetes`` client: kmock's
emulator, run on its own event loop in a background thread, extended with what kmock leaves
out and the adapter relies on — ``labelSelector`` (equality terms), ``limit``/``continue``
paging over a stable order, ``uid``/``creationTimestamp`` on create — and with faults on
demand: a queue of HTTP statuses to answer the next list calls with, and continue tokens
that expire (410 Gone)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import aiohttp.web
import kmock
from kmock import KubernetesEmulator, KubernetesError, Server
from kubernetes import client


class PagingEmulator(KubernetesEmulator):  # type: ignore[misc]
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.list_faults: list[int] = []
        self.expire_continue = False
        self.list_calls: list[dict[str, str]] = []
        self.tokens: dict[str, dict[str, Any]] = {}
        """TokenReviews: a token -> the user it belongs to (``username``, ``groups``)."""
        self.token_reviews = 0

    async def _handle(self, request: Any) -> Any:
        resource = getattr(request.resource, "plural", None)
        if resource == "tokenreviews" and request.action == kmock.action.CREATE:
            self.token_reviews += 1
            token = ((request.data or {}).get("spec") or {}).get("token", "")
            user = self.tokens.get(token)
            status: dict[str, Any] = ({"authenticated": True, "user": user} if user
                                      else {"authenticated": False})
            return aiohttp.web.json_response({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "metadata": {}, "spec": {}, "status": status}, status=201)
        return await super()._handle(request)

    async def _serve_list(self, request: Any) -> Any:
        params = dict(request.params)
        self.list_calls.append(params)
        if self.list_faults:
            status = self.list_faults.pop(0)
            raise KubernetesError(status=status, reason="Injected", message=f"injected {status}")
        if params.get("continue") and self.expire_continue:
            raise KubernetesError(status=410, reason="Expired",
                                  message="the continue token has expired")
        terms = [t.split("=", 1) for t in params.get("labelSelector", "").split(",") if t]
        items = []
        for (resource, namespace, _name), obj in sorted(
                self._objects.items(), key=lambda kv: str(kv[0][2])):
            if resource != request.resource or obj.deleted:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            raw = obj.raw
            labels = (raw.get("metadata") or {}).get("labels") or {}
            if all(labels.get(k) == v for k, v in terms):
                items.append(raw)
        start = int(params.get("continue") or 0)
        limit = int(params.get("limit") or 0) or len(items) or 1
        page = items[start:start + limit]
        meta: dict[str, Any] = {"resourceVersion": "1"}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
            meta["remainingItemCount"] = len(items) - start - limit
        return {"apiVersion": "v1", "kind": "List", "metadata": meta, "items": page}


class KubeAPI:
    """The emulator on a background loop; ``api_client`` talks to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="kube-api")
        self.thread.start()
        self.emulator, self.server = self._run(self._start())
        self.api_client = client.ApiClient(self.configuration())

    def configuration(self, backoff: float = 0.001) -> Any:
        """A client configuration for this server, with the adapter's transport retries
        (a short backoff: tests should not wait)."""
        from jobfence.adapters.kube import retries

        cfg = client.Configuration()
        cfg.host = str(self.server.url).rstrip("/")
        cfg.retries = retries(backoff=backoff)
        return cfg

    def _run(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout=30)

    async def _start(self) -> tuple[PagingEmulator, Server]:
        emulator = PagingEmulator()
        await emulator.__aenter__()
        server = Server(emulator)
        await server.__aenter__()
        return emulator, server

    async def _stop(self) -> None:
        await self.server.__aexit__(None, None, None)
        await self.emulator.__aexit__(None, None, None)

    def close(self) -> None:
        self.api_client.close()
        self._run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    # -- seeding and reading state ---------------------------------------------------------

    def put(self, resource: str, namespace: str, obj: dict[str, Any]) -> None:
        async def put() -> None:
            self.emulator.objects[resource, namespace, obj["metadata"]["name"]] = obj
        self._run(put())

    def objects(self, resource: str, namespace: str) -> list[dict[str, Any]]:
        """Every object of a resource in a namespace, as stored."""
        async def read() -> list[dict[str, Any]]:
            return [dict(obj.raw) for (res, ns, _), obj in self.emulator._objects.items()
                    if res == kmock.resource(resource) and ns == namespace
                    and not obj.deleted]
        return list(self._run(read()))

    def kubeconfig(self, path: Any) -> None:
        """Write a kubeconfig for this server (for a process of its own)."""
        import yaml

        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": str(self.server.url)}}],
            "users": [{"name": "fake", "user": {"token": "serve-account"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))

    def exists(self, resource: str, namespace: str, name: str) -> bool:
        async def check() -> bool:
            key = (kmock.resource(resource), namespace, name)
            return key in self.emulator._objects and not self.emulator._objects[key].deleted
        return bool(self._run(check()))


@contextmanager
def kube_api() -> Iterator[KubeAPI]:
    api = KubeAPI()
    try:
        yield api
    finally:
        api.close()


INSTALLATION = "jf-test"
"""The installation the fake cluster's worker pods belong to unless told otherwise."""


def pod_object(name: str, *, namespace: str = "jobs", phase: str = "Running",
               labels: dict[str, str] | None = None, job: str | None = None,
               started: str = "2026-01-01T00:00:00Z",
               installation: str = INSTALLATION) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "creationTimestamp": started,
                            "labels": labels if labels is not None else {
                                "app.kubernetes.io/name": "jobfence",
                                "app.kubernetes.io/component": "worker",
                                "jobfence.io/installation": installation}}
    if job:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                    "uid": f"uid-{job}", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "worker", "image": "jobfence"}]},
            "status": {"phase": phase, "startTime": started}}
