"""One local cluster: which components, in which order, with which flags; its files; up,
down and whether it is up.

Everything listens on 127.0.0.1. The files live in one directory (``build/cluster`` for
``make cluster-up``, a temporary one for the tests): ``pki/`` (the CA, the serving and
client certificates and the ServiceAccount key, made fresh each time), ``kubeconfig`` (the
admin's), ``env``, ``state.json`` (what runs, to stop it later), ``logs/``, ``etcd/`` and
``node/`` (containerd's and the kubelet's files, the pods' logs). ``down`` stops what ``up``
started and deletes the directory.

The components, in order (a cluster may leave some out: the tests bring their own
PostgreSQL, and start a KEDA operator per test module, watching that module's namespace):

==========================  ===================================================================
etcd                        the API server's storage (``--unsafe-no-fsync``: a throwaway)
kube-apiserver              RBAC and the Node authorizer, ServiceAccount tokens, the default
                            admission plugins (PodSecurity among them) and NodeRestriction;
                            an audit log of deletes of pods and Jobs
kube-controller-manager     the controllers jobfence's objects need
                            (``devtools.cluster.components.CONTROLLERS``), each
                            with its own ServiceAccount's credentials, as in a real cluster
node                        containerd and runc from Debian, a kubelet and kube-scheduler
                            built from the same pinned Kubernetes (``devtools.cluster.node``),
                            in the cluster's own network namespace
                            (``devtools.cluster.network``), running the image
postgres                    a throwaway PostgreSQL with jobfence migrated, a login per role and
                            the role Secrets the manifests read, in namespace ``jobfence``
crds                        KEDA's CRDs (ScaledJob, TriggerAuthentication...) and
                            prometheus-operator's PrometheusRule, from their pinned Go modules
keda                        the KEDA operator (``devtools.cluster.keda``), out of cluster, with
                            KEDA's own RBAC, watching every namespace
==========================  ===================================================================
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools import REPO, controlplane
from devtools import keda as keda_build
from devtools.cluster import certs, components, crds, keda, network
from devtools.cluster.node import Node, kubelet_rbac
from devtools.cluster.node import missing_programs as node_programs_missing
from devtools.cluster.processes import ClusterError, Started, port_free, start, stop, wait_until
from devtools.cluster.rest import ApiError, Credentials, Rest, create_namespace, put_secret
from devtools.gobuild import LINKS, BuildError
from devtools.image import PAUSE_IMAGE

DEFAULT_ROOT = REPO / "build" / "cluster"
NODE = "jobfence-node"
NAMESPACE = "jobfence"
INSTALLATION = "jobfence"
"""The base's ``JOBFENCE_INSTALLATION`` (manifests/config.yaml): the cluster's database is
migrated with it, so that ``make deploy`` of the base works as it is."""

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "node", "postgres",
              "crds", "keda")
NETNS = "jobfence"
"""The network namespace of ``make cluster-up``'s cluster (a test session makes its own)."""


@dataclass(frozen=True)
class Ports:
    api: int = 16443
    etcd: int = 12379
    etcd_peer: int = 12380
    postgres: int = 15432

    def named(self, components: Sequence[str]) -> dict[str, int]:
        out = {}
        if "etcd" in components:
            out.update({"etcd (clients)": self.etcd, "etcd (peers)": self.etcd_peer})
        if "kube-apiserver" in components:
            out["kube-apiserver"] = self.api
        if "postgres" in components:
            out["postgres"] = self.postgres
        return out


@dataclass
class Plane:
    root: Path = DEFAULT_ROOT
    ports: Ports = field(default_factory=Ports)
    components: tuple[str, ...] = COMPONENTS
    owner: int | None = None
    """A process whose end takes the cluster down (the test session's), or None."""
    quiet: bool = False
    netns: str = NETNS
    """The network namespace a real node's cluster runs in (made by ``up`` unless this
    process runs in it already: a test session's)."""
    owns_netns: bool = False
    """The namespace was made for this cluster by its caller (a test session's): ``down``
    deletes it, as it deletes one ``up`` made (the session's watchdog, too)."""
    images: tuple[Path, ...] = ()
    """Image archives imported into the node's containerd at ``up`` (nothing is pulled):
    the pause image's among them (``devtools.image.archive``)."""

    @property
    def real_node(self) -> bool:
        return "node" in self.components

    @property
    def node(self) -> Node:
        return Node(self.root, self.netns, NODE)

    # -- files -----------------------------------------------------------------------------

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def env_file(self) -> Path:
        return self.root / "env"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def api_port(self) -> int:
        """Inside a real node's network namespace, the ``kubernetes`` Service's port."""
        return network.API_PORT if self.real_node else self.ports.api

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports.postgres}/jobfence"

    def say(self, message: str) -> None:
        if not self.quiet:
            print(f"cluster: {message}", flush=True)

    def component_kubeconfig(self, who: certs.Identity) -> Path:
        return components.component_kubeconfig(self.pki, who)

    def admin(self) -> Rest:
        return Rest(Credentials.from_kubeconfig(self.kubeconfig))

    def state(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return data

    # -- up --------------------------------------------------------------------------------

    def preflight(self) -> dict[str, Path]:
        """Everything that can be checked before anything starts: nothing is half-started
        when one of these fails."""
        names = ["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"]
        if self.real_node:
            if os.geteuid() != 0:
                raise ClusterError("the node (containerd, the kubelet) and its network "
                                   "namespace take root: run cluster-up as root")
            missing = node_programs_missing()
            if missing:
                raise ClusterError(f"the node needs {', '.join(missing)}: install them "
                                   f"(make system-cluster as root)")
            if network.exists(self.netns) and not network.inside(self.netns):
                raise ClusterError(f"network namespace {self.netns} exists already (another "
                                   f"cluster's?): take it down, or `ip netns delete "
                                   f"{self.netns}` if nothing uses it")
            names += ["kube-scheduler", "kubelet"]
            for archive in self.images:
                if not archive.is_file():
                    raise ClusterError(f"image archive {archive}: no such file")
        binaries = {}
        for name in names:
            try:
                binaries[name] = controlplane.path(name)
            except BuildError as exc:
                raise ClusterError(str(exc)) from exc
        if "keda" in self.components:
            try:
                binaries["keda-operator"] = keda_build.path()
            except BuildError as exc:
                raise ClusterError(str(exc)) from exc
        if "postgres" in self.components:
            from devtools.embedded_pg import EmbeddedPostgresError, find_bindir

            try:
                find_bindir()
            except EmbeddedPostgresError as exc:
                raise ClusterError(str(exc)) from exc
        if self.real_node and "crds" in self.components:
            crds.prefetch()  # no download is possible from inside the namespace
        if not self.real_node:  # a real node's ports are in its own namespace
            self.check_ports()
        return binaries

    def check_ports(self) -> None:
        ports = self.ports.named(self.components)
        if self.real_node and "kube-apiserver" in ports:
            ports["kube-apiserver"] = network.API_PORT
        for what, port in ports.items():
            if not port_free(port):
                raise ClusterError(f"port {port} on 127.0.0.1 ({what}) is taken: stop what "
                                   f"listens there, or choose another port "
                                   f"({_PORT_SETTING[what]}=...)")

    def up(self) -> None:
        """Start the cluster, or say it is up already; on any failure, stop what was
        started, remove the directory, and raise ClusterError."""
        state_before = self.state()
        if state_before is not None:
            netns = state_before.get("netns")
            if netns and network.exists(netns):
                network.enter(netns)
            if self.healthy():
                self.say(f"already up ({self.root})")
                self.print_usage()
                return
            self.say("a previous cluster is only partly there: taking it down first")
            self.down()
        binaries = self.preflight()
        self.root.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {"root": str(self.root), "ports": self.ports.__dict__,
                                 "components": list(self.components), "processes": {}}
        self._write_state(state)
        try:
            if self.real_node:
                if not network.exists(self.netns):
                    network.create(self.netns)
                    state["netns_created"] = True
                elif self.owns_netns:
                    state["netns_created"] = True
                state["netns"] = self.netns
                self._write_state(state)
                network.enter(self.netns)
                self.check_ports()
            self._start(binaries, state)
        except BaseException as exc:
            self.say(f"start failed: {exc}" if isinstance(exc, ClusterError)
                     else f"start failed ({type(exc).__name__}): taking down what started")
            self.down(quiet=True)
            if isinstance(exc, ClusterError | KeyboardInterrupt):
                raise
            raise ClusterError(f"{type(exc).__name__}: {exc}") from exc
        if not self.quiet:
            self.print_usage()

    def _step(self, what: str, action: Callable[[], Any]) -> Any:
        began = time.monotonic()
        result = action()
        self.say(f"{what} in {time.monotonic() - began:.1f} s")
        return result

    def _start(self, binaries: dict[str, Path], state: dict[str, Any]) -> None:
        began = time.monotonic()
        self._step("certificates made", lambda: components.certificates(
            self.pki, self.server, NODE, self.kubeconfig))
        procs = state["processes"]

        def record(name: str, proc: Started) -> Started:
            procs[name] = proc.row()
            self._write_state(state)
            return proc

        etcd = record("etcd", components.etcd(binaries["etcd"], self.root / "etcd",
                                              self.ports.etcd, self.ports.etcd_peer,
                                              self.logs))
        self._step("etcd ready", lambda: wait_until(
            lambda: components.etcd_healthy(self.ports.etcd), what="etcd", timeout=30,
            proc=etcd))
        api = record("kube-apiserver", components.apiserver(
            binaries["kube-apiserver"], self.pki, etcd_port=self.ports.etcd,
            port=self.api_port, real_node=self.real_node, logs=self.logs))
        self._step("kube-apiserver ready", lambda: wait_until(
            self._api_ready, what="kube-apiserver", timeout=90, proc=api))
        if "kube-controller-manager" in self.components:
            cm = record("kube-controller-manager", components.controller_manager(
                binaries["kube-controller-manager"], self.pki, self.logs))
            self._step("kube-controller-manager ready", lambda: wait_until(
                self._controllers_ready, what="kube-controller-manager", timeout=90, proc=cm))
        if self.real_node:
            self._start_node(binaries, record)
        if "crds" in self.components:
            self._step("CRDs applied (KEDA, PrometheusRule)",
                       lambda: crds.install(binaries["kubectl"], self.kubeconfig))
        if "keda" in self.components:
            def operator() -> None:
                proc, listeners = self.start_keda(self.root / "keda", watch_namespace="",
                                                  binary=binaries["keda-operator"],
                                                  kubectl=binaries["kubectl"])
                record("keda-operator", proc)
                state["keda"] = listeners.row()
                self._write_state(state)

            self._step("KEDA operator ready (every namespace)", operator)
        if "postgres" in self.components:
            state["postgres"] = self._step("PostgreSQL ready, jobfence migrated",
                                           self._postgres)
            self._write_state(state)
            self._step(f"namespace {NAMESPACE} and its role Secrets created",
                       lambda: self._namespace_and_secrets(state["postgres"]["urls"]))
        if self.owner is not None:
            record("watch", start([sys.executable, "-m", "devtools.cluster", "watch",
                                   "--dir", str(self.root), "--owner", str(self.owner)],
                                  log=self.logs / "watch.log", cwd=REPO))
        self._write_env()
        self.say(f"up in {time.monotonic() - began:.1f} s")

    def _write_state(self, state: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_file)

    def start_keda(self, where: Path, *, watch_namespace: str, binary: Path | None = None,
                   kubectl: Path | None = None, log_level: str = "info"
                   ) -> tuple[Started, keda.Listeners]:
        """A KEDA operator against this cluster watching ``watch_namespace`` ("": all), its
        files in ``where``; returns once it is ready. Its RBAC applied first (idempotent)."""
        binary = binary or keda_build.path()
        kubectl = kubectl or controlplane.path("kubectl")
        keda.rbac(kubectl, self.kubeconfig)
        if not where.resolve().is_relative_to(self.root.resolve()) \
                or not where.name.startswith("keda"):
            raise ClusterError(f"{where}: a KEDA operator's files live in {self.root}/keda*, "
                               "where cluster-down finds it")
        where.mkdir(parents=True, exist_ok=True)
        ca = certs.Authority.load(self.pki)
        crt, key = ca.client(keda.IDENTITY)
        kubeconfig = where / "kubeconfig"
        components.kubeconfig(kubeconfig, self.server, ca.ca_file, crt, key,
                              user=keda.IDENTITY.user)
        cert_dir = keda.certificates(ca, where)
        listeners = keda.Listeners.free()
        proc = keda.start_operator(binary, where=where, kubeconfig=kubeconfig,
                                   cert_dir=cert_dir, listeners=listeners,
                                   watch_namespace=watch_namespace, log_level=log_level)
        (where / "process.json").write_text(json.dumps(proc.row()) + "\n")
        try:
            keda.wait_ready(proc, listeners)
        except BaseException:
            stop(proc)
            raise
        return proc, listeners

    def _start_node(self, binaries: dict[str, Path],
                    record: Callable[[str, Started], Started]) -> None:
        """containerd (the pause image and ``images`` imported), the kubelet and the
        scheduler; returns once the node is Ready and its registration taint lifted."""
        node = self.node
        containerd = record("containerd", node.start_containerd(self.logs))
        self._step("containerd ready", lambda: wait_until(
            node.containerd_ready, what="containerd", timeout=30, proc=containerd))
        def import_images() -> None:
            for archive in self.images:
                node.import_image(archive)

        self._step("images imported", import_images)
        if PAUSE_IMAGE not in node.images():
            raise ClusterError(f"no pause image ({PAUSE_IMAGE}) among the images imported: "
                               "`make image-archive` writes it (build/image/pause.tar)")
        with self.admin() as api:
            for binding in kubelet_rbac():
                try:
                    api.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
                except ApiError as exc:
                    if exc.status != 409:
                        raise
        record("kube-scheduler", node.start_scheduler(
            binaries["kube-scheduler"], self.component_kubeconfig(certs.SCHEDULER), self.logs))
        kubelet = record("kubelet", node.start_kubelet(
            binaries["kubelet"], self.component_kubeconfig(certs.node(NODE)), self.pki,
            self.logs))
        self._step(f"node {NODE} Ready (kubelet, containerd)", lambda: wait_until(
            self._node_schedulable, what="the kubelet", timeout=120, proc=kubelet))
        node.restore_sysctls()

    def stop_kubelet(self) -> None:
        """The node goes away: its kubelet killed (SIGKILL, no goodbye), its containers left
        running under containerd as a machine cut off from the network leaves them."""
        state = self.state() or {}
        row = state.get("processes", {}).get("kubelet")
        if row is None:
            raise ClusterError("no kubelet runs in this cluster")
        started = Started(**row)
        if started.alive():
            os.kill(started.pid, signal.SIGKILL)
        wait_until(lambda: not started.alive(), what="the kubelet gone", timeout=30)

    def start_kubelet(self) -> None:
        """The node back: a kubelet again with the same files (it finds the containers of
        pods deleted meanwhile and stops them); returns once the node is Ready."""
        state = self.state()
        if state is None:
            raise ClusterError(f"no cluster in {self.root}")
        kubelet = self.node.start_kubelet(
            controlplane.path("kubelet"), self.component_kubeconfig(certs.node(NODE)),
            self.pki, self.logs)
        state["processes"]["kubelet"] = kubelet.row()
        self._write_state(state)
        wait_until(self._node_schedulable, what="the kubelet", timeout=120, proc=kubelet)
        self.node.restore_sysctls()

    def _node_schedulable(self) -> bool:
        """Ready, and without the taints a node registers with (the node-lifecycle
        controller lifts them)."""
        with self.admin() as api:
            node = api.get(f"/api/v1/nodes/{NODE}")
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (node.get("status") or {}).get("conditions") or [])
        return ready and not (node.get("spec") or {}).get("taints")

    def _api_ready(self) -> bool:
        with self.admin() as api:
            return api.request("GET", "/readyz").get("raw") == "ok"

    def _controllers_ready(self) -> bool:
        """The controllers are at work once the default namespace has its ServiceAccount
        (serviceaccount controller) and the root CA ConfigMap (root-CA publisher)."""
        with self.admin() as api:
            return api.exists("/api/v1/namespaces/default/serviceaccounts/default") \
                and api.exists("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")

    def _node_ready(self) -> bool:
        with self.admin() as api:
            node = api.get(f"/api/v1/nodes/{NODE}")
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (node.get("status") or {}).get("conditions") or [])

    def _postgres(self) -> dict[str, Any]:
        from devtools.cluster import database

        if self.real_node:
            return database.start(self.ports.postgres, self.logs, pods_reach=network.GATEWAY,
                                  pods_network=network.POD_SUBNET)
        return database.start(self.ports.postgres, self.logs)

    def _namespace_and_secrets(self, urls: dict[str, str]) -> None:
        with self.admin() as api:
            create_namespace(api, NAMESPACE)
            for kind, url in urls.items():
                put_secret(api, NAMESPACE, f"jobfence-database-{kind}", {"url": url})

    def _write_env(self) -> None:
        lines = ["# Written by `make cluster-up`: the local control plane. `. build/cluster/env`",
                 f"export KUBECONFIG={self.kubeconfig}",
                 f"export PATH={LINKS}:$PATH"]
        if self.real_node:
            # kubectl for a shell outside the cluster's network namespace: it enters it.
            wrappers = self.root / "bin"
            wrappers.mkdir(exist_ok=True)
            kubectl = wrappers / "kubectl"
            kubectl.write_text("#!/bin/sh\n# kubectl inside the local cluster's network "
                               "namespace (make cluster-up).\n"
                               f"exec {' '.join(network.nsenter(self.netns))} "
                               f"{LINKS / 'kubectl'} \"$@\"\n")
            kubectl.chmod(0o755)
            lines[-1] = f"export PATH={wrappers}:{LINKS}:$PATH"
        if "postgres" in self.components:
            lines.append(f"export JOBFENCE_DATABASE_URL={self.database_url}")
        self.env_file.write_text("\n".join(lines) + "\n")

    def print_usage(self) -> None:
        rel = _relative(self.root)
        if self.real_node:
            shell = " ".join(network.nsenter(self.netns))
            print(f"""
The local cluster is up (node {NODE}: kubelet and containerd; API server {self.server})
in network namespace {self.netns}: what talks to it runs there too.
  make cluster-shell                   # a shell in it: kubectl, jobfence, psql reach it
  . {rel}/env                          # KUBECONFIG, JOBFENCE_DATABASE_URL, kubectl on PATH
  kubectl get nodes,pods -A            # (this kubectl enters the namespace itself)
  {shell} make deploy KUBECONFIG={rel}/kubeconfig IMAGE=localhost/jobfence:VERSION
  kubectl -n {NAMESPACE} create job --from=cronjob/jobfence-sweeper once
  kubectl -n {NAMESPACE} logs job/once
Pods reach PostgreSQL and the API server at {network.GATEWAY}; the components' logs are
in {rel}/logs/, the pods' in {rel}/node/pod-logs/, KEDA's in {rel}/keda/operator.log.
`make cluster-down` stops it all, removes {rel} and the namespace.""", flush=True)
            return
        print(f"""
The local cluster is up (node {NODE}, API server {self.server}).
  . {rel}/env                          # KUBECONFIG, JOBFENCE_DATABASE_URL, kubectl on PATH
  kubectl get nodes,pods -A
  make deploy KUBECONFIG={rel}/kubeconfig
  kubectl -n {NAMESPACE} get scaledjobs,jobs,pods      # the pools KEDA scales
  kubectl -n {NAMESPACE} create job --from=cronjob/jobfence-sweeper once
  kubectl -n {NAMESPACE} logs job/once
The components' logs in {rel}/logs/ and KEDA's in {rel}/keda/operator.log (no node:
nothing runs pods).
`make cluster-down` stops it all and removes {rel}.""", flush=True)

    # -- state -----------------------------------------------------------------------------

    def healthy(self) -> bool:
        state = self.state()
        if state is None:
            return False
        for name, row in state.get("processes", {}).items():
            if name != "watch" and not Started(**row).alive():
                return False
        try:
            return self._api_ready() and (
                not self.real_node or self._node_ready())
        except Exception:
            return False

    def down(self, *, quiet: bool = False) -> bool:
        """Stop everything ``up`` started (the node first: its pods' processes die with
        it), stop PostgreSQL, delete the directory. False if nothing was there."""
        state = self.state()
        if state is None and not self.root.exists():
            return False
        processes = (state or {}).get("processes", {})
        for row in self.root.glob("keda*/process.json"):  # the tests' operators too
            with contextlib.suppress(OSError, ValueError, TypeError):
                stop(Started(**json.loads(row.read_text())))
        for name in ("watch", "keda-operator", "kubelet", "kube-scheduler"):
            if name in processes and not (name == "watch" and _is_self(processes[name])):
                stop(Started(**processes[name]))
        node = Node(self.root, (state or {}).get("netns") or self.netns, NODE)
        if "containerd" in processes:
            node.kill_pods()
            stop(Started(**processes["containerd"]))
            node.kill_pods()
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            if name in processes:
                stop(Started(**processes[name]))
        if state and state.get("postgres"):
            from devtools.cluster import database

            database.stop(state["postgres"])
        if state and state.get("netns"):
            node.clean()
            if state.get("netns_created"):
                network.delete(state["netns"])
        shutil.rmtree(self.root, ignore_errors=True)
        if not quiet:
            self.say(f"down: stopped {', '.join(processes) or 'nothing'}; removed "
                     f"{_relative(self.root)}")
        return True


_PORT_SETTING = {"etcd (clients)": "CLUSTER_ETCD_PORT", "etcd (peers)": "CLUSTER_ETCD_PEER_PORT",
                 "kube-apiserver": "CLUSTER_API_PORT", "postgres": "CLUSTER_PG_PORT"}


def _is_self(row: dict[str, Any]) -> bool:
    return int(row["pid"]) == os.getpid()


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
