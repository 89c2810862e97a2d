"""The Kubernetes adapter's retries and a pass's failed deletes against the real API server.

Between the adapter and the session's real API server stands a proxy on 127.0.0.1 that
forwards every request (over TLS, with the caller's own bearer token) and, where a test
says so, answers instead: throttling (429 with ``Retry-After``), server errors (5xx), a
connection closed without an answer. What is not faulted is the real server's answer —
its authorizer, its selectors, its deletes. (The transport's retries against kmock, where
a unit test needs faults by the hundred: tests/unit/test_kube_transport.py.)
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from jobfence.adapters.kube import KubernetesCluster
from jobfence.errors import ClusterError
from jobfence.passes import orphan_cleanup
from jobfence.passes.harness import Deps
from jobfence.settings import Settings
from jobfence.store import Store
from tests.support.kube import WORKER_LABELS, ControlPlane, remote_pod, token

SELECTOR = "app.kubernetes.io/name=jobfence,app.kubernetes.io/component=worker"
INSTALLATION = "jf-faults"
LABELS = {**WORKER_LABELS, "jobfence.io/installation": INSTALLATION}
DROP = -1
"""A fault that closes the connection without an answer."""
Fault = Callable[[str, str], int | None]
"""What the proxy does with a request (method, path): a status to answer, DROP, or None to
forward it to the real server."""
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
       "proxy-connection", "te", "trailer", "upgrade"}


class FaultProxy:
    """HTTP on 127.0.0.1 in front of the real API server's HTTPS."""

    def __init__(self, server: str, ca_file: str) -> None:
        target = urlsplit(server)
        self.fault: Fault = lambda method, path: None
        self.seen: list[tuple[str, str, int | None]] = []
        """Every request: method, path, and the fault answered (None: forwarded)."""
        self.lock = threading.Lock()
        context = ssl.create_default_context(cafile=ca_file)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def handle_any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    fault = proxy.fault(self.command, self.path)
                    proxy.seen.append((self.command, self.path, fault))
                if fault == DROP:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fault is not None:
                    data = b'{"kind":"Status","apiVersion":"v1","status":"Failure",' \
                           b'"message":"injected by the test","code":%d}' % fault
                    self.send_response(fault)
                    if fault == 429:
                        self.send_header("Retry-After", "1")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                upstream = http.client.HTTPSConnection(target.hostname or "127.0.0.1",
                                                       target.port, context=context,
                                                       timeout=30)
                try:
                    upstream.request(self.command, self.path, body=body, headers={
                        k: v for k, v in self.headers.items() if k.lower() not in HOP})
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.http.handle_error = lambda *_: None  # type: ignore[method-assign]  # a client gone
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def faulted(self, method: str) -> list[int | None]:
        return [f for m, _, f in self.seen if m == method and f is not None]

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def proxy(kube: ControlPlane) -> Iterator[FaultProxy]:
    creds = kube.credentials()
    p = FaultProxy(creds.server, str(creds.ca_file))
    yield p
    p.close()


@pytest.fixture
def account(kube: ControlPlane, namespace: str) -> str:
    """A token as orphan-cleanup's ServiceAccount would hold one: allowed to list and
    delete pods and Jobs in the test's namespace (and nowhere else), by the real
    authorizer."""
    with kube.admin() as api:
        api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                 {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "faults"}})
        api.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "faults"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": "faults",
                          "namespace": namespace}]})
    return token(kube, namespace, "faults")


def through(kube: ControlPlane, proxy: FaultProxy, account: str,
            namespace: str) -> KubernetesCluster:
    """The adapter for ``namespace``, holding ``account``'s token, through the proxy."""
    cfg = kube.client_configuration(account)
    cfg.host = proxy.url
    return KubernetesCluster(namespace=namespace, selector=SELECTOR, installation=INSTALLATION,
                             page_size=2, cfg=cfg)


@pytest.fixture
def adapter(kube: ControlPlane, namespace: str, proxy: FaultProxy,
            account: str) -> KubernetesCluster:
    return through(kube, proxy, account, namespace)


def seed(kube: ControlPlane, namespace: str, names: list[str], phase: str = "Running") -> None:
    with kube.admin() as api:
        for name in names:
            remote_pod(api, namespace, name, labels=LABELS, phase=phase)


def script(*faults: int) -> Fault:
    """The first requests that list pods answered with ``faults``, in order; the rest
    forwarded."""
    left = list(faults)

    def fault(method: str, path: str) -> int | None:
        if method == "GET" and "/pods" in path and left:
            return left.pop(0)
        return None

    return fault


def test_throttling_server_errors_and_dropped_connections_are_retried(
        kube: ControlPlane, namespace: str, adapter: KubernetesCluster,
        proxy: FaultProxy) -> None:
    seed(kube, namespace, [f"w-{i}" for i in range(5)])
    proxy.fault = script(429, 503, DROP, 500, 502)
    started = time.monotonic()
    pages = list(adapter.worker_pod_pages())
    took = time.monotonic() - started
    assert sorted(p.name for page in pages for p in page) == [f"w-{i}" for i in range(5)]
    assert proxy.faulted("GET") == [429, 503, DROP, 500, 502]
    forwarded = [p for m, p, f in proxy.seen if m == "GET" and f is None]
    assert len(forwarded) == 3  # the three pages, each from the real server once
    assert took >= 1.0  # the 429's Retry-After was waited for


def test_a_server_that_keeps_failing_is_a_cluster_error_and_a_refusal_is_not_retried(
        kube: ControlPlane, namespace: str, adapter: KubernetesCluster,
        proxy: FaultProxy, account: str) -> None:
    seed(kube, namespace, ["w-0", "w-1", "w-2"])
    proxy.fault = script(*[503] * 20)
    with pytest.raises(ClusterError, match="503"):
        list(adapter.worker_pod_pages())
    assert len(proxy.faulted("GET")) == 6  # the transport's attempts, then given up
    proxy.fault = lambda method, path: None
    elsewhere = through(kube, proxy, account, "kube-system")
    with pytest.raises(ClusterError, match="403"):  # the real authorizer: not retried
        elsewhere.delete_pod("anything", uid=None, grace_seconds=0)
    assert [m for m, p, _ in proxy.seen if "kube-system" in p] == ["DELETE"]


def test_a_failed_delete_on_the_real_server_is_counted_and_the_pass_goes_on(
        kube: ControlPlane, namespace: str, adapter: KubernetesCluster,
        proxy: FaultProxy, store: Store, dsn: str) -> None:
    """orphan-cleanup with history 0: every finished worker pod goes — but the server
    fails every delete of one of them; that one is counted, the others are gone from the
    real server, and the pass ends as it should."""
    names = ["done-a", "done-b", "done-c"]
    seed(kube, namespace, names, phase="Succeeded")
    proxy.fault = lambda method, path: (
        500 if method == "DELETE" and path.split("?")[0].endswith("/pods/done-b") else None)
    s = Settings(database_url=dsn, finished_pod_history=0,
                 reconcile_grace_seconds=0, orphan_pod_grace_seconds=600)
    report = orphan_cleanup.run_once(s, Deps(store, s, cluster_port=adapter,
                                             now=datetime.now(UTC)))
    assert (report.finished_pods_deleted, report.finished_pods_cleanup_failures) == (2, 1)
    assert len(proxy.faulted("DELETE")) == 6  # retried as a server error is, then counted
    with kube.admin() as api:
        left = {p["metadata"]["name"]: p["metadata"].get("deletionTimestamp")
                for p in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]}
    assert left.get("done-b", "gone") is None  # untouched: still there, not terminating
    for name in ("done-a", "done-c"):  # deleted by the real server (or terminating)
        assert name not in left or left[name] is not None, left
