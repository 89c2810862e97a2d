"""The node agent's loop: one Ready Node, the pods bound to it, their containers' processes,
their status.

Two watches feed it: the scheduler's (pods no node is chosen for yet: bound to this node
through ``pods/binding``, with the scheduler's identity) and the kubelet's (pods bound to
this node, with the node's identity, which the Node authorizer and NodeRestriction judge as
they judge a kubelet). Everything else happens on the main thread, a pod at a time:
prepare its volumes and environment, start its containers in order, report through
``pods/status``, and on deletion SIGTERM, wait the grace period, SIGKILL, write a terminal
phase and delete the pod with a UID precondition.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devtools.cluster.agent import podspec
from devtools.cluster.agent.logs import LogServer
from devtools.cluster.agent.podspec import ConfigError, Obj
from devtools.cluster.agent.runtime import Process, now_iso
from devtools.cluster.rest import ApiError, Rest, pods_path

log = logging.getLogger("node-agent")

MIN_GRACE = 2
"""A force deletion (grace 0) still gives the containers this long, as the kubelet does."""
RETRY_SECONDS = 2.0
HEARTBEAT_SECONDS = 30.0
VERSION = "v1.35.4-jobfence-node-agent"


def b64(data: Mapping[str, str]) -> dict[str, bytes]:
    import base64

    return {k: base64.b64decode(v) for k, v in data.items()}


class Watcher(threading.Thread):
    """List, then watch from the list's resourceVersion; relist after any error. Puts
    ("LIST", items) and (TYPE, object) on the queue."""

    def __init__(self, rest: Rest, path: str, params: dict[str, str], out: queue.Queue[Any],
                 tag: str) -> None:
        super().__init__(daemon=True, name=f"watch-{tag}")
        self.rest, self.path, self.params, self.out, self.tag = rest, path, params, out, tag
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                listed = self.rest.get(self.path, **self.params)
                self.out.put((self.tag, "LIST", listed.get("items") or []))
                version = listed["metadata"]["resourceVersion"]
                for event in self.rest.watch(self.path, resource_version=version,
                                             **self.params):
                    if self.stopping.is_set():
                        return
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        break  # 410 Gone and the like: relist
                    if kind != "BOOKMARK":
                        self.out.put((self.tag, kind, obj))
            except Exception as exc:
                if not self.stopping.is_set():
                    log.warning("watch %s: %s; relisting", self.tag, exc)
                    time.sleep(1)


class PodRun:
    """One pod on this node: its processes and what the agent knows of it."""

    def __init__(self, agent: Agent, pod: Obj) -> None:
        self.agent = agent
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.ns: str = pod["metadata"]["namespace"]
        self.name: str = pod["metadata"]["name"]
        self.dir = agent.root / "pods" / self.uid
        self.logs = agent.root / "logs" / f"{self.ns}_{self.name}_{self.uid}"
        self.started = now_iso()
        self.procs = [Process(kind, c["name"], c.get("image", ""))
                      for kind, c in podspec.all_containers(pod)]
        self.prepared: dict[str, Any] | None = None
        self.next_try = 0.0
        self.refused = False
        self.gone = False
        """The pod object is gone from the API (deleted, or force-deleted)."""
        self.kill_at: float | None = None
        self.phase: str | None = None
        """Succeeded or Failed once decided; written before any delete."""
        self.deleted = False
        self.written: Obj | None = None
        self.events: set[tuple[str, str]] = set()

    # -- small views -----------------------------------------------------------------------

    def spec_of(self, proc: Process) -> Obj:
        for kind, c in podspec.all_containers(self.pod):
            if c["name"] == proc.name and kind == proc.kind:
                return c
        raise KeyError(proc.name)

    @property
    def mains(self) -> list[Process]:
        return [p for p in self.procs if p.kind == "main"]

    @property
    def sidecars(self) -> list[Process]:
        return [p for p in self.procs if p.kind == "sidecar"]

    @property
    def deleting(self) -> bool:
        return self.gone or self.pod["metadata"].get("deletionTimestamp") is not None

    def running(self) -> list[Process]:
        return [p for p in self.procs if p.running]

    # -- the steps -------------------------------------------------------------------------

    def step(self) -> None:
        for p in self.procs:
            if p.poll():
                log.info("%s/%s: container %s exited %s", self.ns, self.name, p.name,
                         p.exit_code)
        if self.deleting:
            self.terminate()
        elif self.phase is None:
            self.advance()
        if self.phase is None and not self.running() and self._all_started_or_done():
            self.phase = self._verdict()
        if not self.gone:
            self.report()
        if self.deleting and self.phase is not None and not self.running() \
                and not self.deleted and not self.gone:
            self.delete()

    def _all_started_or_done(self) -> bool:
        """Every container ended (or will never start): the phase can be decided."""
        return all(p.done for p in self.mains) and all(not p.running for p in self.procs)

    def _verdict(self) -> str:
        if any(p.kind == "init" and p.done and p.exit_code != 0 for p in self.procs):
            return "Failed"
        if self.mains and all(p.exit_code == 0 for p in self.mains):
            return "Succeeded"
        return "Failed"

    def advance(self) -> None:
        """Start what may start next: init containers one by one (a sidecar is started and
        left running), then every main container; stop the sidecars once the mains ended."""
        if self.refused or time.monotonic() < self.next_try:
            return
        if self.prepared is None and not self.prepare():
            return
        for p in self.procs:
            if p.kind == "init":
                if p.done and p.exit_code != 0:
                    self.stop_all(grace=self.grace())  # restartPolicy Never: the pod fails
                    self._kill_if_due()
                    for q in self.procs:
                        if q.proc is None and q.exit_code is None:
                            q.exit_code, q.reason = 137, "ContainerStatusUnknown"
                            q.finished_at = now_iso()
                    return
                if not p.done:
                    if p.proc is None:
                        self.launch(p)
                    return
            elif p.kind == "sidecar":
                if p.proc is None:
                    self.launch(p)
                if not p.started:
                    return  # what comes after a sidecar starts once it has started
        for p in self.mains:
            if p.proc is None:
                self.launch(p)
        if all(p.done for p in self.mains):
            self.stop_sidecars()

    def prepare(self) -> bool:
        """Images, users, environments and volumes of every container, before any starts."""
        refused = [p for p in self.procs if not podspec.runnable(p.image)]
        if refused:
            self.refused = True
            for p in refused:
                message = (f'Failed to pull image "{p.image}": the node agent runs only images '
                           "named jobfence… (the project's own environment), not "
                           f"{podspec.image_name(p.image)!r}")
                p.waiting = ("ErrImagePull", message)
                self.event("Warning", "Failed", message, p.name)
            return False
        text, binary = self.agent.lookups(self.ns)
        try:
            plans = podspec.volumes(self.pod, binary, self.token)
            volume_dirs = {plan.name: podspec.write_volume(plan, self.dir / "volumes")
                           for plan in plans}
            prepared: dict[str, Any] = {}
            for p in self.procs:
                container = self.spec_of(p)
                env = podspec.environment(self.pod, container, text,
                                          self.agent.base_env(self.pod))
                prepared[p.name] = {
                    "user": podspec.user_of(self.pod, container),
                    "env": env, "argv": podspec.argv_of(container, env),
                    "cwd": container.get("workingDir") or podspec.IMAGE_WORKDIR,
                    "mounts": podspec.mounts_of(container, volume_dirs)}
        except (ConfigError, ApiError) as exc:
            for p in self.procs:
                p.waiting = ("CreateContainerConfigError", str(exc))
            self.event("Warning", "Failed", f"Error: {exc}")
            self.next_try = time.monotonic() + RETRY_SECONDS
            return False
        self.prepared = prepared
        return True

    def token(self, source: Obj) -> str:
        """A ServiceAccount token bound to this pod, requested as the kubelet does."""
        meta, spec = self.pod["metadata"], self.pod["spec"]
        account = spec.get("serviceAccountName") or "default"
        request: Obj = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": source.get("expirationSeconds", 3607),
                                 "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                                    "name": meta["name"], "uid": meta["uid"]}}}
        if source.get("audience"):
            request["spec"]["audiences"] = [source["audience"]]
        answer = self.agent.node_api.post(
            f"/api/v1/namespaces/{self.ns}/serviceaccounts/{account}/token", request)
        return str(answer["status"]["token"])

    def launch(self, p: Process) -> None:
        assert self.prepared is not None
        plan = self.prepared[p.name]
        p.start(directory=self.dir, log=self.logs / f"{p.name}.log", user=plan["user"],
                argv=plan["argv"], env=plan["env"], cwd=plan["cwd"], mounts=plan["mounts"],
                hostname=self.pod["spec"].get("hostname") or self.name)
        self.event("Normal", "Started", f"Started container {p.name}", p.name)

    def grace(self) -> int:
        meta = self.pod["metadata"]
        if meta.get("deletionGracePeriodSeconds") is not None:
            return max(MIN_GRACE, int(meta["deletionGracePeriodSeconds"]))
        return max(MIN_GRACE, int(self.pod["spec"].get("terminationGracePeriodSeconds", 30)))

    def stop_all(self, grace: int) -> None:
        if self.kill_at is None:
            self.kill_at = time.monotonic() + grace
        for p in self.procs:
            p.signal(signal.SIGTERM)

    def stop_sidecars(self) -> None:
        if any(p.running for p in self.sidecars):
            if self.kill_at is None:
                self.kill_at = time.monotonic() + self.grace()
            for p in reversed(self.sidecars):
                p.signal(signal.SIGTERM)
        self._kill_if_due()

    def terminate(self) -> None:
        """Deletion: SIGTERM the main containers, then the sidecars once the mains are gone,
        SIGKILL whatever is left when the grace period is over."""
        if self.kill_at is None:
            self.kill_at = time.monotonic() + (MIN_GRACE if self.gone else self.grace())
            if self.running():
                self.event("Normal", "Killing", "Stopping container(s)")
        for p in self.mains:
            p.signal(signal.SIGTERM)
        if not any(p.running for p in self.mains):
            for p in reversed(self.sidecars):
                p.signal(signal.SIGTERM)
        self._kill_if_due()
        if not self.running() and self.phase is None:
            for p in self.procs:
                if not p.done:  # never started: the kubelet reports it the same way
                    p.exit_code, p.reason, p.finished_at = 137, "ContainerStatusUnknown", now_iso()
            self.phase = self._verdict()

    def _kill_if_due(self) -> None:
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            for p in self.procs:
                if p.running:
                    p.kill_now()

    # -- the API ---------------------------------------------------------------------------

    def status(self) -> Obj:
        def entry(p: Process) -> Obj:
            return {"name": p.name, "image": p.image,
                    "imageID": f"jobfence-env://{sys.prefix}",
                    "containerID": f"node-agent://{self.uid}/{p.name}",
                    "ready": p.running, "started": p.running, "restartCount": 0,
                    "state": p.state(), "lastState": {}}

        init_done = all((p.kind == "init" and p.done and p.exit_code == 0)
                        or (p.kind == "sidecar" and p.proc is not None)
                        for p in self.procs if p.kind != "main")
        ready = self.phase is None and bool(self.mains) and all(p.running for p in self.mains)
        phase = self.phase or ("Running" if any(p.proc is not None for p in self.mains)
                               else "Pending")
        stamp = now_iso()

        def cond(kind: str, ok: bool, reason: str | None = None) -> Obj:
            out = {"type": kind, "status": "True" if ok else "False",
                   "lastTransitionTime": stamp, "lastProbeTime": None}
            if reason:
                out["reason"] = reason
            return out

        done_reason = "PodCompleted" if self.phase else None
        conditions = [cond("PodReadyToStartContainers", self.prepared is not None),
                      cond("Initialized", init_done, done_reason if init_done else None),
                      cond("ContainersReady", ready, done_reason),
                      cond("Ready", ready, done_reason),
                      cond("PodScheduled", True)]
        return {"phase": phase, "conditions": conditions, "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}], "podIP": "127.0.0.1",
                "podIPs": [{"ip": "127.0.0.1"}], "startTime": self.started,
                "initContainerStatuses": [entry(p) for p in self.procs if p.kind != "main"],
                "containerStatuses": [entry(p) for p in self.mains]}

    def report(self) -> None:
        status = self.status()
        comparable = _without_times(status)
        if comparable == self.written:
            return
        old = {c["type"]: c for c in (self.pod.get("status") or {}).get("conditions") or []}
        for c in status["conditions"]:  # keep transition times of unchanged conditions
            if c["type"] in old and old[c["type"]].get("status") == c["status"]:
                c["lastTransitionTime"] = old[c["type"]].get("lastTransitionTime")
        try:
            self.pod = self.agent.node_api.patch(
                pods_path(self.ns, self.name, "status"),
                {"metadata": {"uid": self.uid}, "status": status})
            self.written = comparable
        except ApiError as exc:
            if exc.status == 404:
                self.gone = True
            elif exc.status != 409:
                log.warning("%s/%s: status: %s", self.ns, self.name, exc)

    def delete(self) -> None:
        """The kubelet's last word on a pod whose deletion was asked for: grace 0, and only
        this pod (a UID precondition); finalizers are left to whoever put them there."""
        try:
            self.agent.node_api.delete(pods_path(self.ns, self.name), {
                "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": self.uid}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("%s/%s: delete: %s", self.ns, self.name, exc)
                return
        self.deleted = True

    def event(self, kind: str, reason: str, message: str, container: str | None = None) -> None:
        if (reason, message) in self.events:
            return
        self.events.add((reason, message))
        involved: Obj = {"apiVersion": "v1", "kind": "Pod", "namespace": self.ns,
                         "name": self.name, "uid": self.uid}
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        stamp = now_iso()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{self.name}.", "namespace": self.ns},
                "involvedObject": involved, "reason": reason, "message": message,
                "type": kind, "source": {"component": "kubelet", "host": self.agent.node},
                "reportingComponent": "kubelet", "reportingInstance": self.agent.node,
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        try:
            self.agent.node_api.post(f"/api/v1/namespaces/{self.ns}/events", body)
        except ApiError as exc:
            log.warning("%s/%s: event %s: %s", self.ns, self.name, reason, exc)

    def finished(self) -> bool:
        """Gone from the API and nothing left running: forgotten. A pod deleted by the agent
        but still there (a finalizer not removed yet) stays known, so that it is not
        deleted again."""
        return self.gone and not self.running()

    def clean(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _without_times(status: Obj) -> Obj:
    out = dict(status)
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                         for c in status["conditions"]]
    return out


class Agent:
    def __init__(self, *, root: Path, node: str, node_api: Rest, scheduler_api: Rest,
                 admin_api: Rest, api_port: int, binds: bool = True,
                 logs: LogServer | None = None) -> None:
        self.root, self.node, self.api_port, self.binds = root, node, api_port, binds
        self.logs = logs
        self.node_api, self.scheduler_api, self.admin_api = node_api, scheduler_api, admin_api
        self.events: queue.Queue[Any] = queue.Queue()
        self.runs: dict[str, PodRun] = {}
        self.by_name: dict[tuple[str, str], PodRun] = {}
        """The latest run of each (namespace, name), for the log endpoint's thread."""
        self.stopping = False
        self.watchers: list[Watcher] = []

    # -- what pods read --------------------------------------------------------------------

    def _read(self, kind: str, namespace: str, name: str) -> Obj | None:
        path = {"secret": "secrets", "configmap": "configmaps"}[kind]
        try:
            return self.node_api.get(f"/api/v1/namespaces/{namespace}/{path}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def lookups(self, namespace: str) -> tuple[podspec.Lookup, podspec.Binary]:
        """A namespace's Secrets and ConfigMaps as text (environment) and as bytes (files),
        read with the node's identity: the Node authorizer lets a node read only what a pod
        bound to it references."""
        def text(kind: str, name: str) -> dict[str, str] | None:
            obj = self._read(kind, namespace, name)
            if obj is None:
                return None
            if kind == "secret":
                return {k: v.decode() for k, v in b64(obj.get("data") or {}).items()}
            return dict(obj.get("data") or {})

        def binary(kind: str, name: str) -> dict[str, bytes] | None:
            obj = self._read(kind, namespace, name)
            if obj is None:
                return None
            if kind == "secret":
                return b64(obj.get("data") or {})
            return {**{k: v.encode() for k, v in (obj.get("data") or {}).items()},
                    **b64(obj.get("binaryData") or {})}

        return text, binary

    def base_env(self, pod: Obj) -> dict[str, str]:
        """The image's environment and the kubelet's own variables."""
        port = str(self.api_port)
        return {"PATH": f"{sys.prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                        "/sbin:/bin",
                "HOME": podspec.IMAGE_WORKDIR, "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1",
                "HOSTNAME": pod["spec"].get("hostname") or pod["metadata"]["name"],
                "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port,
                "KUBERNETES_SERVICE_PORT_HTTPS": port,
                "KUBERNETES_PORT": f"tcp://127.0.0.1:{port}",
                "KUBERNETES_PORT_443_TCP": f"tcp://127.0.0.1:{port}",
                "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
                "KUBERNETES_PORT_443_TCP_ADDR": "127.0.0.1",
                "KUBERNETES_PORT_443_TCP_PORT": port}

    # -- the node --------------------------------------------------------------------------

    def node_status(self) -> Obj:
        stamp = now_iso()
        conditions = [
            {"type": kind, "status": "False", "reason": f"KubeletHas{ok}",
             "message": f"the node agent does not model {what}",
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
            for kind, ok, what in (("MemoryPressure", "SufficientMemory", "memory pressure"),
                                   ("DiskPressure", "NoDiskPressure", "disk pressure"),
                                   ("PIDPressure", "SufficientPID", "PID pressure"))]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "jobfence's node agent is posting ready status",
                           "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
        capacity = {"cpu": "2", "memory": "8Gi", "pods": "110", "ephemeral-storage": "20Gi"}
        return {"conditions": conditions, "capacity": capacity, "allocatable": capacity,
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": self.node}],
                "daemonEndpoints": {"kubeletEndpoint": {
                    "Port": self.logs.port if self.logs else 0}},
                "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "",
                             "kernelVersion": "", "osImage": "this machine",
                             "containerRuntimeVersion": "node-agent://0",
                             "kubeletVersion": VERSION, "kubeProxyVersion": "",
                             "operatingSystem": "linux", "architecture": "amd64"}}

    def register(self) -> None:
        """Create (or take over) the Node, Ready, and lift the not-ready taint the
        TaintNodesByCondition admission put on it, as the node-lifecycle controller would."""
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node,
                             "labels": {"kubernetes.io/hostname": self.node,
                                        "kubernetes.io/os": "linux",
                                        "kubernetes.io/arch": "amd64"}}}
        with contextlib.suppress(ApiError):
            self.node_api.post("/api/v1/nodes", body)
        self.heartbeat()
        node = self.admin_api.get(f"/api/v1/nodes/{self.node}")
        taints = [t for t in node["spec"].get("taints") or []
                  if t["key"] != "node.kubernetes.io/not-ready"]
        if taints != (node["spec"].get("taints") or []):
            self.admin_api.patch(f"/api/v1/nodes/{self.node}", {"spec": {"taints": taints}})

    def heartbeat(self) -> None:
        self.node_api.patch(f"/api/v1/nodes/{self.node}/status", {"status": self.node_status()},
                            kind="strategic")

    # -- pods ------------------------------------------------------------------------------

    def bind(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        if spec.get("nodeName") or meta.get("deletionTimestamp") \
                or spec.get("schedulerName", "default-scheduler") != "default-scheduler" \
                or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        try:
            self.scheduler_api.post(pods_path(meta["namespace"], meta["name"], "binding"), {
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                             "uid": meta["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("binding %s/%s: %s", meta["namespace"], meta["name"], exc)

    def recover(self) -> None:
        """After a restart: the pods this node no longer runs (their processes died with the
        previous agent) are Failed, as the kubelet reports containers it cannot find."""
        listed = self.node_api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node}")
        for pod in listed.get("items") or []:
            status = pod.get("status") or {}
            started = [c for c in [*(status.get("initContainerStatuses") or []),
                                   *(status.get("containerStatuses") or [])]
                       if "waiting" not in (c.get("state") or {"waiting": {}})]
            if status.get("phase") in ("Succeeded", "Failed") or not started:
                continue  # finished, or never started: nothing was lost
            run = PodRun(self, pod)
            for p in run.procs:
                p.exit_code, p.reason, p.finished_at = 137, "ContainerStatusUnknown", now_iso()
                p.waiting = None
            run.prepared = {}
            run.phase = "Failed"
            run.report()
            log.info("%s/%s: not running after the agent's restart: Failed", run.ns, run.name)
            self.runs[run.uid] = run
        shutil.rmtree(self.root / "pods", ignore_errors=True)

    def on_pod(self, kind: str, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        run = self.runs.get(uid)
        if kind == "DELETED":
            if run is not None:
                run.gone = True
            return
        if run is None:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                if pod["metadata"].get("deletionTimestamp"):
                    run = PodRun(self, pod)
                    run.phase = phase
                    run.written = None
                    run.delete()
                return
            run = self.runs[uid] = PodRun(self, pod)
            self.by_name[run.ns, run.name] = run
        run.pod = pod

    def on_list(self, pods: list[Obj]) -> None:
        present = {p["metadata"]["uid"] for p in pods}
        for uid, run in self.runs.items():
            if uid not in present:
                run.gone = True
        for pod in pods:
            self.on_pod("MODIFIED", pod)

    def locate(self, namespace: str, pod: str, container: str
               ) -> tuple[Path, Callable[[], bool]] | None:
        """A container's log file, for the log endpoint (another thread: reads only)."""
        run = self.by_name.get((namespace, pod))  # one dict read: safe beside the loop
        procs = [p for p in run.procs if p.name == container] if run else []
        if run is None or not procs:
            return None
        return run.logs / f"{container}.log", lambda: procs[0].running

    def run(self) -> None:
        if self.logs:
            self.logs.start()
        self.register()
        self.recover()
        self.watchers = [
            Watcher(self.node_api, "/api/v1/pods",
                    {"fieldSelector": f"spec.nodeName={self.node}"}, self.events, "node")]
        if self.binds:
            self.watchers.append(Watcher(
                self.scheduler_api, "/api/v1/pods",
                {"fieldSelector": "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"},
                self.events, "scheduler"))
        for w in self.watchers:
            w.start()
        beat = time.monotonic()
        while not self.stopping:
            try:
                tag, kind, obj = self.events.get(timeout=0.1)
                self.dispatch(tag, kind, obj)
                while True:
                    tag, kind, obj = self.events.get_nowait()
                    self.dispatch(tag, kind, obj)
            except queue.Empty:
                pass
            for uid, run in list(self.runs.items()):
                try:
                    run.step()
                except Exception:
                    log.exception("%s/%s: step failed", run.ns, run.name)
                if run.finished():
                    run.clean()
                    del self.runs[uid]
                    if self.by_name.get((run.ns, run.name)) is run:
                        del self.by_name[run.ns, run.name]
            if time.monotonic() - beat > HEARTBEAT_SECONDS:
                beat = time.monotonic()
                with contextlib.suppress(ApiError, OSError):
                    self.heartbeat()
        self.shutdown()

    def dispatch(self, tag: str, kind: str, obj: Any) -> None:
        if tag == "scheduler":
            for pod in obj if kind == "LIST" else [obj]:
                if kind != "DELETED":
                    self.bind(pod)
        elif kind == "LIST":
            self.on_list(obj)
        else:
            self.on_pod(kind, obj)

    def shutdown(self) -> None:
        if self.logs:
            self.logs.stop()
        for w in self.watchers:
            w.stopping.set()
        for run in self.runs.values():
            for p in run.procs:
                p.kill_now(timeout=2)
