"""The KEDA operator of a local cluster, run out of cluster against its API server, as KEDA's
own ``make run`` does — and only the operator: ScaledJobs need no metrics server.

* its identity: the ServiceAccount ``keda/keda-operator`` that KEDA's own RBAC
  (``config/rbac`` of the pinned module, applied server-side) binds its ClusterRole to, as a
  client certificate of the cluster's CA (``system:serviceaccount:keda:keda-operator``);
* ``WATCH_NAMESPACE`` (empty: every namespace; the tests give each module's namespace an
  operator of its own) and ``KEDA_CLUSTER_OBJECT_NAMESPACE``/``POD_NAMESPACE`` set (out of
  cluster there is no ServiceAccount namespace file to read them from);
* every listener on 127.0.0.1 at a free port (metrics, health probes, the gRPC metrics
  service), where the defaults take every interface;
* the certificates its gRPC metrics service insists on (``ca.crt``, ``tls.crt``,
  ``tls.key`` in ``--cert-dir``) even with certificate rotation off, made per cluster.

Its log is ``<dir>/operator.log``: each poll's query errors and each Job it creates.
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from devtools.cluster import certs
from devtools.cluster.processes import ClusterError, Started, start, wait_until

NAMESPACE = "keda"
IDENTITY = certs.Identity("keda-operator", f"system:serviceaccount:{NAMESPACE}:keda-operator",
                          ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"))


@dataclass(frozen=True)
class Listeners:
    metrics: int
    health: int
    grpc: int

    @classmethod
    def free(cls) -> Listeners:
        from devtools.embedded_pg import free_port

        return cls(free_port(), free_port(), free_port())

    def row(self) -> dict[str, Any]:
        return asdict(self)


def rbac(kubectl: Path, kubeconfig: Path) -> None:
    """KEDA's namespace and its own RBAC (``config/rbac`` of the pinned module)."""
    from devtools import keda

    rendered = subprocess.run([str(kubectl), "kustomize", str(keda.source() / "config" / "rbac")],
                              capture_output=True, text=True, check=False)
    if rendered.returncode != 0:
        raise ClusterError(f"kustomize KEDA's config/rbac: {rendered.stderr.strip()}")
    namespace = (f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n---\n")
    applied = subprocess.run([str(kubectl), "--kubeconfig", str(kubeconfig), "apply",
                              "--server-side", "--field-manager=jobfence-cluster-up", "-f", "-"],
                             input=namespace + rendered.stdout, capture_output=True, text=True,
                             check=False)
    if applied.returncode != 0:
        raise ClusterError(f"applying KEDA's RBAC: {applied.stderr.strip()}")


def certificates(ca: certs.Authority, where: Path) -> Path:
    """``where/certs``: the gRPC metrics service's ca.crt, tls.crt and tls.key."""
    cert_dir = where / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    crt, key = ca.serving_for("keda-operator-serving", ("localhost", "keda-operator",
                                                f"keda-operator.{NAMESPACE}.svc"))
    (cert_dir / "tls.crt").write_bytes(crt.read_bytes())
    (cert_dir / "tls.key").write_bytes(key.read_bytes())
    (cert_dir / "tls.key").chmod(0o600)
    (cert_dir / "ca.crt").write_bytes(ca.ca_file.read_bytes())
    return cert_dir


def start_operator(binary: Path, *, where: Path, kubeconfig: Path, cert_dir: Path,
                   listeners: Listeners, watch_namespace: str, log_level: str = "info"
                   ) -> Started:
    where.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig),
           "WATCH_NAMESPACE": watch_namespace, "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
           "POD_NAMESPACE": NAMESPACE, "POD_NAME": "keda-operator-local",
           "OPERATOR_NAME": "keda-operator", "HOME": str(where)}
    return start([str(binary), "--leader-elect=false",
                  f"--metrics-bind-address=127.0.0.1:{listeners.metrics}",
                  f"--health-probe-bind-address=127.0.0.1:{listeners.health}",
                  f"--metrics-service-bind-address=127.0.0.1:{listeners.grpc}",
                  f"--cert-dir={cert_dir}", f"--ca-dir={cert_dir}",
                  "--enable-cert-rotation=false", "--enable-webhook-patching=false",
                  "--enable-apiservice-patching=false", f"--zap-log-level={log_level}",
                  "--zap-encoder=console"],
                 log=where / "operator.log", env=env, cwd=where)


def ready(listeners: Listeners) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(
                f"http://127.0.0.1:{listeners.health}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(proc: Started, listeners: Listeners, timeout: float = 60) -> None:
    wait_until(lambda: ready(listeners), what="the KEDA operator", timeout=timeout, proc=proc)
