"""The control plane's processes — etcd, kube-apiserver, kube-controller-manager — with
their flags, and the certificates and kubeconfigs they and the node use (``pki/``, made
fresh at each ``up``). ``devtools.cluster.plane`` starts them in order and waits for each."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import yaml

from devtools.cluster import certs, network
from devtools.cluster.processes import Started, start

CONTROLLERS = ("job-controller", "cronjob-controller", "garbage-collector-controller",
               "ttl-after-finished-controller", "namespace-controller",
               "serviceaccount-controller", "serviceaccount-token-controller",
               "root-ca-certificate-publisher-controller",
               "clusterrole-aggregation-controller", "node-lifecycle-controller")
"""The node-lifecycle controller lifts the taint a node registers with once the node is
Ready, and marks a node that stops reporting NotReady."""

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Request", "verbs": ["delete", "deletecollection"],
               "resources": [{"group": "", "resources": ["pods"]},
                             {"group": "batch", "resources": ["jobs"]}]},
              {"level": "Metadata", "verbs": ["create"],
               "resources": [{"group": "authentication.k8s.io",
                              "resources": ["tokenreviews"]}]},
              {"level": "None"}]}
"""Who deleted which pod or Job, with the request body (its preconditions), and who asked
for TokenReviews: the tests read it."""


def component_kubeconfig(pki: Path, who: certs.Identity) -> Path:
    return pki / f"{who.file}.kubeconfig"


def certificates(pki: Path, server: str, node: str, admin_kubeconfig: Path) -> None:
    """The CA, the API server's serving certificate, the ServiceAccount key, a client
    certificate and kubeconfig for each component, the kubelet's, the audit policy."""
    pki.mkdir(parents=True, exist_ok=True)
    ca = certs.Authority(pki)
    ca.serving()
    certs.service_account_key(pki)
    for who in (certs.ADMIN, certs.CONTROLLER_MANAGER, certs.SCHEDULER, certs.node(node)):
        crt, key = ca.client(who)
        kubeconfig(component_kubeconfig(pki, who), server, ca.ca_file, crt, key,
                   user=who.user)
    ca.client(certs.KUBELET_CLIENT)
    ca.kubelet_serving(node)
    shutil.copyfile(component_kubeconfig(pki, certs.ADMIN), admin_kubeconfig)
    (pki / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))


def kubeconfig(path: Path, server: str, ca: Path, crt: Path, key: Path, *, user: str) -> None:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "jobfence-local",
        "clusters": [{"name": "jobfence-local",
                      "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(crt),
                                          "client-key": str(key)}}],
        "contexts": [{"name": "jobfence-local",
                      "context": {"cluster": "jobfence-local", "user": user}}]}))
    path.chmod(0o600)


def etcd(binary: Path, data: Path, port: int, peer_port: int, logs: Path) -> Started:
    client, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
    return start([str(binary), "--name", "local", "--data-dir", str(data),
                  "--listen-client-urls", client, "--advertise-client-urls", client,
                  "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                  "--initial-cluster", f"local={peer}", "--unsafe-no-fsync",
                  "--log-level", "warn"], log=logs / "etcd.log")


def etcd_healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                timeout=2) as resp:
        return bool(resp.status == 200)


def apiserver(binary: Path, pki: Path, *, etcd_port: int, port: int, real_node: bool,
              logs: Path) -> Started:
    p = pki
    # With a real node, in the cluster's own network namespace: on every address of it
    # (127.0.0.1, the node's IP, the kubernetes Service's IP where pods reach it).
    bind, advertise = (("0.0.0.0", network.GATEWAY) if real_node  # noqa: S104
                       else ("127.0.0.1", "127.0.0.1"))
    return start([
        str(binary), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        f"--bind-address={bind}", f"--advertise-address={advertise}",
        f"--secure-port={port}", f"--cert-dir={p}",
        f"--tls-cert-file={p / 'apiserver.crt'}",
        f"--tls-private-key-file={p / 'apiserver.key'}",
        f"--client-ca-file={p / 'ca.crt'}",
        "--service-cluster-ip-range=10.0.0.0/24", "--endpoint-reconciler-type=none",
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={p / 'sa.key'}",
        f"--service-account-signing-key-file={p / 'sa.key'}",
        f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={p / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP",
        f"--audit-policy-file={p / 'audit-policy.yaml'}",
        f"--audit-log-path={logs / 'audit.log'}", "--audit-log-format=json",
        "--audit-log-maxsize=200", "--profiling=false", "--v=0"],
        log=logs / "kube-apiserver.log")


def controller_manager(binary: Path, pki: Path, logs: Path) -> Started:
    return start([
        str(binary),
        f"--kubeconfig={component_kubeconfig(pki, certs.CONTROLLER_MANAGER)}",
        "--leader-elect=false", "--secure-port=0", "--use-service-account-credentials",
        f"--controllers={','.join(CONTROLLERS)}",
        # A node that stops reporting is NotReady within 20 s (Kubernetes' default: 50 s;
        # the kubelet renews its lease every 10 s).
        "--node-monitor-period=2s", "--node-monitor-grace-period=20s",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}", "--cluster-name=jobfence-local", "--v=0"],
        log=logs / "kube-controller-manager.log")
