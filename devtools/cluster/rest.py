"""A small JSON client of the Kubernetes API for the dev tools (cluster-up, the tests'
helpers): raw paths and dicts, client-certificate or bearer-token identities,
watches as a stream of events. The product itself talks to Kubernetes through the official
client in ``jobfence.adapters.kube``; this one lets a test say exactly what it sends
(preconditions, field selectors, status subresources: a remote node's pod status).
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml

Obj = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, body: Obj | str, method: str, path: str) -> None:
        self.status, self.body = status, body
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:300]
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        super().__init__(f"{method} {path}: HTTP {status} {message}")


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Credentials:
        """The current context of a kubeconfig this package wrote (file references)."""
        cfg = yaml.safe_load(path.read_text())
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        return cls(cluster["server"], cluster["certificate-authority"],
                   user.get("client-certificate"), user.get("client-key"), user.get("token"))

    def with_token(self, token: str) -> Credentials:
        return Credentials(self.server, self.ca_file, token=token)


class Rest:
    def __init__(self, creds: Credentials, *, timeout: float = 30.0) -> None:
        self.creds = creds
        ctx = ssl.create_default_context(cafile=creds.ca_file)
        if creds.cert_file and creds.key_file:
            ctx.load_cert_chain(creds.cert_file, creds.key_file)
        self.http = urllib3.PoolManager(ssl_context=ctx, maxsize=8, retries=False,
                                        timeout=urllib3.Timeout(connect=5, read=timeout))
        self.headers = {"Accept": "application/json"}
        if creds.token:
            self.headers["Authorization"] = f"Bearer {creds.token}"

    def url(self, path: str, params: dict[str, Any] | None = None) -> str:
        query = f"?{urlencode({k: v for k, v in params.items() if v is not None})}" \
            if params else ""
        return f"{self.creds.server}{path}{query}"

    def request(self, method: str, path: str, body: Any = None, *,
                params: dict[str, Any] | None = None,
                content_type: str = "application/json") -> Obj:
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        resp = self.http.request(method, self.url(path, params), body=data, headers=headers)
        text = resp.data.decode() if resp.data else ""
        try:
            parsed: Any = json.loads(text) if text else {}
        except json.JSONDecodeError:
            parsed = text
        if resp.status >= 400:
            raise ApiError(resp.status, parsed, method, path)
        return parsed if isinstance(parsed, dict) else {"raw": parsed}

    def get(self, path: str, **params: Any) -> Obj:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any, **params: Any) -> Obj:
        return self.request("POST", path, body, params=params)

    def put(self, path: str, body: Any, **params: Any) -> Obj:
        return self.request("PUT", path, body, params=params)

    def patch(self, path: str, body: Any, *, kind: str = "merge", **params: Any) -> Obj:
        types = {"merge": "application/merge-patch+json",
                 "strategic": "application/strategic-merge-patch+json",
                 "json": "application/json-patch+json",
                 "apply": "application/apply-patch+yaml"}
        return self.request("PATCH", path, body, params=params, content_type=types[kind])

    def delete(self, path: str, body: Any = None, **params: Any) -> Obj:
        return self.request("DELETE", path, body, params=params)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def watch(self, path: str, *, resource_version: str | None = None,
              timeout_seconds: int = 300, **params: Any) -> Iterator[Obj]:
        """Events of a watch until the server ends it (a reconnect is the caller's)."""
        query = {**params, "watch": "1", "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(timeout_seconds), "resourceVersion": resource_version}
        resp = self.http.request("GET", self.url(path, query), headers=self.headers,
                                 preload_content=False,
                                 timeout=urllib3.Timeout(connect=5, read=timeout_seconds + 30))
        try:
            if resp.status >= 400:
                raise ApiError(resp.status, resp.read().decode(), "WATCH", path)
            buffer = b""
            for chunk in resp.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()

    def close(self) -> None:
        self.http.clear()

    def __enter__(self) -> Rest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pods_path(namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    if name:
        base += f"/{name}"
    if sub:
        base += f"/{sub}"
    return base


RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted"
              for mode in ("enforce", "warn", "audit")}


def create_namespace(api: Rest, name: str, labels: dict[str, str] | None = None) -> None:
    """A namespace whose pods must meet the ``restricted`` Pod Security Standard (and whose
    workloads' templates are warned about), as manifests/README.md asks for."""
    body = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {**RESTRICTED, **(labels or {})}}}
    try:
        api.post("/api/v1/namespaces", body)
    except ApiError as exc:
        if exc.status != 409:
            raise


def put_secret(api: Rest, namespace: str, name: str, data: dict[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
    try:
        api.post(f"/api/v1/namespaces/{namespace}/secrets", body)
    except ApiError as exc:
        if exc.status != 409:
            raise
        api.put(f"/api/v1/namespaces/{namespace}/secrets/{name}", body)
