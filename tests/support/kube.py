"""The tests' real Kubernetes control plane, and what the tests do with it.

One control plane per test session, whatever the number of test processes: the session's
first process to need it starts it (``devtools.cluster.plane``, without its own PostgreSQL
— each test brings its database) under a file lock in ``JOBFENCE_TEST_CLUSTER_DIR``; the
other processes attach to it. Its node is a real one (containerd and a kubelet running the
image, ``localhost/jobfence:VERSION``, imported from its archive) in a network namespace the
session makes before any test process starts and runs in (``configure_session``): the
tests, their PostgreSQL servers and the cluster reach each other on 127.0.0.1, the pods
reach the servers on the node's bridge (``devtools.cluster.network``). The session's main
process set that directory up and takes the cluster down at its end (``conftest.py``), and
a watchdog process takes it down if that process dies first. Each test works in a namespace
of its own, labelled for the ``restricted`` Pod Security Standard.

Conditions are polled with generous deadlines (the machine is shared), never slept on.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import psycopg.sql
import yaml

from devtools import controlplane
from devtools.cluster import certs, network
from devtools.cluster.node import missing_programs
from devtools.cluster.plane import NODE, Plane, Ports
from devtools.cluster.rest import ApiError, Credentials, Rest, create_namespace, put_secret
from devtools.deploy import Kubectl, apply, overlay
from devtools.embedded_pg import free_port
from devtools.roles import as_login, ensure_logins, login_name
from jobfence.store.roles import KINDS
from tests.support import REPO

T = TypeVar("T")
DIR_ENV, OWNER_ENV = "JOBFENCE_TEST_CLUSTER_DIR", "JOBFENCE_TEST_CLUSTER_OWNER"
NETNS_ENV = "JOBFENCE_TEST_CLUSTER_NETNS"
OUTSIDE_ENV = "JOBFENCE_TEST_OUTSIDE_NETNS"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "node", "crds")
IMAGE = "localhost/jobfence:0.1.0"
"""The image the manifests name (`make image` builds it under this name)."""
Obj = dict[str, Any]


def outside() -> list[str]:
    """The argv prefix that runs a command in the machine's own network namespace, out of
    the session's cluster's (nothing when the session runs in the machine's)."""
    name = os.environ.get(OUTSIDE_ENV)
    return network.nsenter(name) if name and network.exists(name) else []


def wait_for(fn: Callable[[], T], *, what: str, timeout: float = 60.0,
             interval: float = 0.2) -> T:
    """Poll ``fn`` until it gives something true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    value = fn()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {value!r})")
        time.sleep(interval)
        value = fn()
    return value


# -- the session's control plane ---------------------------------------------------------------


def configure_session() -> None:
    """In the session's main process, before any test process starts: where the control
    plane will live, and whose end takes it down."""
    if not os.environ.get(DIR_ENV):
        os.environ[DIR_ENV] = tempfile.mkdtemp(prefix="jobfence-test-cluster-")
        os.environ[OWNER_ENV] = str(os.getpid())
        # The cluster's network namespace, entered now: every test process runs in it.
        # Without root (or the node's programs) the cluster's tests say why when they start.
        name = f"jft-{os.getpid()}"
        if os.geteuid() == 0 and not missing_programs() \
                and not network.exists(name):
            from devtools.cluster import crds

            with contextlib.suppress(Exception):  # else the cluster's start says why
                crds.prefetch()  # nothing can be downloaded from inside the namespace
            network.create(name)
            # The machine's own network namespace, named, for what must reach the network
            # (pip and its package index: ``outside``).
            subprocess.run(["ip", "netns", "attach", f"{name}-host", str(os.getpid())],
                           capture_output=True, check=False)
            network.enter(name)
            os.environ[NETNS_ENV] = name
            os.environ[OUTSIDE_ENV] = f"{name}-host"


def end_session() -> None:
    """In the main process, after every test: stop the control plane if one was started."""
    where = os.environ.get(DIR_ENV)
    if where and os.environ.get(OWNER_ENV) == str(os.getpid()):
        netns = os.environ.get(NETNS_ENV)
        Plane(Path(where), quiet=True, components=COMPONENTS,
              netns=netns or "jft-none").down(quiet=True)
        if netns:
            network.delete(netns)
            network.delete(f"{netns}-host")
        with contextlib.suppress(OSError):
            Path(where).rmdir()
        Path(f"{where}.lock").unlink(missing_ok=True)
        import shutil

        shutil.rmtree(REPO / "build" / "test-deploy", ignore_errors=True)


@dataclass
class ControlPlane:
    plane: Plane
    kubectl: Path

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def admin(self) -> Rest:
        return self.plane.admin()

    def credentials(self, who: certs.Identity = certs.ADMIN) -> Credentials:
        return Credentials.from_kubeconfig(self.plane.component_kubeconfig(who))

    def client_configuration(self, token: str | None = None) -> Any:
        """The official client's configuration for this server: as the admin, or as the
        holder of ``token``; with the adapter's transport retries."""
        from kubernetes import client

        from jobfence.adapters.kube import retries

        creds = self.credentials()
        cfg = client.Configuration()
        cfg.host = creds.server
        cfg.ssl_ca_cert = creds.ca_file
        if token:
            cfg.api_key = {"authorization": f"Bearer {token}"}
        else:
            cfg.cert_file, cfg.key_file = creds.cert_file, creds.key_file
        cfg.retries = retries(backoff=0.01)
        return cfg

    def run(self, *args: str, input: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """kubectl (the built one) as the admin."""
        return subprocess.run([str(self.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
                              input=input, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def audit(self) -> list[Obj]:
        """Every audited request so far (deletes of pods and Jobs, with their bodies)."""
        path = self.plane.logs / "audit.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def container_log(self, namespace: str, pod: Obj | str, container: str = "jobfence") -> str:
        """What a container wrote, from the kubelet's files (kept until the pod's containers
        are removed: read them before, or follow them with ``LogFollower``), in order."""
        logs = self.plane.node.pod_logs
        if isinstance(pod, dict):
            name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
            dirs = [logs / f"{namespace}_{name}_{uid}"]
        else:
            dirs = sorted(logs.glob(f"{namespace}_{pod}_*"))
        return "".join(cri_log_text(f) for d in dirs
                       for f in sorted((d / container).glob("*.log"),
                                       key=lambda f: int(f.stem) if f.stem.isdigit() else 0))


def session_cluster() -> ControlPlane:
    """The session's control plane: started by the first process that asks, under a lock."""
    where = os.environ.get(DIR_ENV)
    if not where:  # a process outside a pytest session (not expected): a private one
        configure_session()
        where = os.environ[DIR_ENV]
    root = Path(where)
    kubectl = controlplane.path("kubectl")
    root.mkdir(parents=True, exist_ok=True)
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = Plane(root, components=COMPONENTS).state()
        netns = os.environ.get(NETNS_ENV) or "jft-none"
        if state is None:
            ports = Ports(api=free_port(), etcd=free_port(), etcd_peer=free_port(), postgres=0)
            owner = int(os.environ.get(OWNER_ENV) or os.getpid())
            plane = Plane(root, ports, COMPONENTS, owner=owner, quiet=True, netns=netns,
                          owns_netns=True, images=image_archives())
            plane.up()
        else:
            plane = Plane(root, Ports(**state["ports"]), COMPONENTS, quiet=True, netns=netns)
    return ControlPlane(plane, kubectl)


def image_archives() -> tuple[Path, ...]:
    """The image's and the pause image's archives (``make image-archive``; the image is
    built first if its inputs changed)."""
    from devtools import image

    written = (image.OUT / "jobfence.tar", image.OUT / "pause.tar")
    if os.environ.get("JOBFENCE_TEST_IMAGE_ARCHIVES") == "as-written" \
            and all(p.exists() for p in written):
        return written  # a run that knows the image is unchanged since `make image-archive`
    return tuple(image.archive(IMAGE))


def cri_log_text(path: Path) -> str:
    """A kubelet log file's text: each line is ``TIME STREAM P|F TEXT``, ``P`` a part of a
    line the next one continues."""
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        out.append(text if parts[2] == "P" else text + "\n")
    return "".join(out)


# -- a namespace per test --------------------------------------------------------------------

_names = itertools.count()


def namespace_name(test_name: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:30].strip("-")
    return f"t{os.getpid() % 100000}-{next(_names)}-{base}".strip("-")[:63]


def new_namespace(cluster: ControlPlane, test_name: str, labels: dict[str, str] | None = None
                  ) -> str:
    """A restricted namespace, ready for pods (its default ServiceAccount and root CA made
    by the controllers)."""
    name = namespace_name(test_name)
    with cluster.admin() as api:
        create_namespace(api, name, labels)
        wait_for(lambda: api.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default")
                 and api.exists(f"/api/v1/namespaces/{name}/configmaps/kube-root-ca.crt"),
                 what=f"namespace {name} ready")
    return name


def delete_namespace(cluster: ControlPlane, name: str) -> None:
    with cluster.admin() as api, contextlib.suppress(ApiError):
        api.delete(f"/api/v1/namespaces/{name}")


# -- jobfence in a namespace -----------------------------------------------------------------


@dataclass
class Installation:
    """jobfence deployed into a namespace (the base, as ``make deploy`` applies it),
    reaching the test's database as one login per role."""

    cluster: ControlPlane
    namespace: str
    dsn: str
    installation: str
    schema: str = "jobfence"
    suffix: str = ""
    """The overlay's nameSuffix: a second installation in the namespace."""
    applied: str = ""
    """What the server-side apply said on stderr (warnings: PodSecurity...)."""

    def api(self) -> Rest:
        return self.cluster.admin()

    def run_from_cronjob(self, function: str, name: str | None = None) -> str:
        """``kubectl create job --from=cronjob/jobfence-<function>``: the Job's name."""
        name = name or f"{function}-by-hand-{next(_names)}"
        out = self.cluster.run("-n", self.namespace, "create", "job",
                               f"--from=cronjob/jobfence-{function}{self.suffix}", name)
        assert out.returncode == 0, out.stderr
        return name

    def job(self, name: str) -> Obj:
        with self.api() as api:
            return api.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{name}")

    def wait_job(self, name: str, condition: str = "Complete", timeout: float = 120) -> Obj:
        def done() -> Obj | None:
            job = self.job(name)
            conds = {c["type"] for c in (job.get("status") or {}).get("conditions") or []
                     if c["status"] == "True"}
            if condition not in conds and conds & {"Failed", "Complete"}:
                raise AssertionError(f"job {name}: {conds}, not {condition}; logs:\n"
                                     + self.logs_of_job(name))
            return job if condition in conds else None

        return wait_for(done, what=f"job {name} {condition}", timeout=timeout)

    def pods(self, selector: str = "", *, all_phases: bool = True) -> list[Obj]:
        with self.api() as api:
            items = api.get(f"/api/v1/namespaces/{self.namespace}/pods",
                            labelSelector=selector)["items"]
        return [p for p in items if all_phases
                or (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    def pods_of_job(self, name: str) -> list[Obj]:
        return self.pods(f"batch.kubernetes.io/job-name={name}")

    def logs_of_job(self, name: str, container: str = "jobfence") -> str:
        return "".join(self.cluster.container_log(self.namespace, p, container)
                       for p in self.pods_of_job(name))

    def summary(self, job: str) -> Obj:
        """The pass's JSON summary (the last JSON line with "function" in its pod's log)."""
        for line in reversed(self.logs_of_job(job).splitlines()):
            with contextlib.suppress(json.JSONDecodeError):
                data = json.loads(line)
                if isinstance(data, dict) and "function" in data:
                    return data
        raise AssertionError(f"no summary in the log of {job}:\n{self.logs_of_job(job)}")

    def sql(self, query: str, *params: Any) -> list[dict[str, Any]]:
        from devtools.sqlconn import connect

        with connect(self.dsn, schema=self.schema) as conn:
            return list(conn.execute(query, params).fetchall())

    def pod_story(self, pod: Obj) -> Obj:
        """What became of a pod: its phase and reason, its containers' states and logs (for
        a failing test's message)."""
        status = pod.get("status") or {}
        return {"name": pod["metadata"]["name"], "phase": status.get("phase"),
                "reason": status.get("reason"), "message": status.get("message"),
                "containers": [(c.get("name"), c.get("state")) for c in [
                    *(status.get("initContainerStatuses") or []),
                    *(status.get("containerStatuses") or [])]],
                "log": self.cluster.container_log(self.namespace, pod)[-1500:],
                "sidecar": self.cluster.container_log(self.namespace, pod,
                                                      "command-runner")[-800:]}

    def claiming_pod(self, job_id: str, job_name: str, timeout: float = 120) -> Obj:
        """Once the job runs: the Running pod of Job ``job_name`` that holds its claim."""
        def claimed() -> Obj | None:
            [row] = self.sql("SELECT status, claimed_by FROM jobs WHERE job_id = %s", job_id)
            return next((p for p in self.pods_of_job(job_name)
                         if row["status"] == "running"
                         and p["metadata"]["name"] == row["claimed_by"]
                         and p["status"].get("phase") == "Running"), None)

        return wait_for(claimed, what=f"a pod of {job_name} running job {job_id}",
                        timeout=timeout)

    def story(self, job_id: str) -> Obj:
        """What became of a job and of the installation's pods: for a failing test's message."""
        pods = [self.pod_story(p) for p in self.pods()]
        return {"job": self.sql("SELECT status, attempt_count, claimed_by, error FROM jobs "
                                "WHERE job_id = %s", job_id),
                "events": self.sql("SELECT from_status, to_status, reason FROM job_events "
                                   "WHERE job_id = %s ORDER BY event_id", job_id),
                "results": self.sql("SELECT status, error, result FROM job_action_results "
                                    "WHERE job_id = %s", job_id),
                "pods": pods}

    def wait_status(self, job_id: str, *statuses: str, attempts: int = 0,
                    timeout: float = 120) -> Obj:
        """Poll until the job's status is one of ``statuses`` after at least ``attempts``
        attempts; fail with its story."""
        try:
            return wait_for(lambda: next((r for r in self.sql(
                "SELECT status, attempt_count, claimed_by, error FROM jobs WHERE job_id = %s",
                job_id) if r["status"] in statuses and r["attempt_count"] >= attempts), None),
                what=f"job {job_id} {'/'.join(statuses)}", timeout=timeout, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{json.dumps(self.story(job_id), default=str, indent=1)}"
                                 ) from None

    def worker_job(self, name: str, pool: str = "default", **overrides: Any) -> Obj:
        """A worker Job as KEDA makes one from the pool's ScaledJob (its jobTargetRef)."""
        with self.api() as api:
            scaled = api.get(f"/apis/keda.sh/v1alpha1/namespaces/{self.namespace}/scaledjobs/"
                             f"jobfence-worker-{pool}")
        spec = {**scaled["spec"]["jobTargetRef"], **overrides}
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": name, "namespace": self.namespace,
                            "labels": {"scaledjob.keda.sh/name": f"jobfence-worker-{pool}"}},
               "spec": spec}
        with self.api() as api:
            return api.post(f"/apis/batch/v1/namespaces/{self.namespace}/jobs", job)


def installation_of(dsn: str, schema: str = "jobfence") -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(psycopg.sql.SQL("SELECT installation FROM {}.jobfence_control")
                           .format(psycopg.sql.Identifier(schema))).fetchone()
    assert row is not None and row[0]
    return str(row[0])


def role_urls(dsn: str, schema: str = "jobfence") -> dict[str, str]:
    """Each role's login URL for the test database (the logins made once per server), as
    the node's pods reach it: on the node's bridge."""
    from psycopg.conninfo import make_conninfo

    ensure_logins(dsn, schema)
    return {kind: make_conninfo(as_login(dsn, login_name(schema, kind)), host=network.GATEWAY)
            for kind in KINDS}


TEST_CONFIG = {
    # A claim judged at once, an unclaimed pod deleted by the second pass: seconds, not
    # minutes (the shipped values are 15 s and 180 s).
    "JOBFENCE_RECONCILE_GRACE_SECONDS": "0",
    "JOBFENCE_ORPHAN_POD_GRACE_SECONDS": "0",
    "JOBFENCE_LEASE_SECONDS": "30",
    "JOBFENCE_RETRY_BASE_SECONDS": "0",
}


SUSPENDED = {"target": {"kind": "CronJob"},
             "patch": json.dumps([{"op": "add", "path": "/spec/suspend", "value": True}])}
"""The CronJobs' schedules held: a test runs each function by hand when it wants it (a tick
at the same time would hold the function's lease, and the run by hand would skip)."""


def install(cluster: ControlPlane, namespace: str, dsn: str, *,
            config: dict[str, str] | None = None, components: tuple[str, ...] = (),
            s3: dict[str, str] | None = None, schema: str = "jobfence",
            name_suffix: str = "", scheduled: bool = False,
            patches: tuple[Obj, ...] = ()) -> Installation:
    """jobfence deployed as ``make deploy`` deploys it (the same overlay, checks, server-side
    apply and wait for the migration Job), its role Secrets pointing at ``dsn``'s database,
    its installation the one that database was migrated with; its CronJobs suspended
    unless ``scheduled``; ``patches`` added to the overlay as they are."""
    identity = installation_of(dsn, schema)
    urls = role_urls(dsn, schema)
    secrets = {f"jobfence-database-{kind}": {"url": url} for kind, url in urls.items()}
    if not name_suffix:  # as a person creates them (manifests/README.md)
        with cluster.admin() as api:
            for name, data in secrets.items():
                put_secret(api, namespace, name, data)
    settings = {**TEST_CONFIG, "JOBFENCE_SCHEMA": schema, **(s3 or {}), **(config or {})}
    if not s3:
        settings["JOBFENCE_S3_BUCKET"] = ""
    where = REPO / "build" / "test-deploy" / f"{namespace}{name_suffix}"
    overlay(namespace=namespace, image=IMAGE, installation=identity, components=components,
            runbook_url="https://runbook.test/docs/RUNBOOK.md", where=where, config=settings,
            name_suffix=name_suffix, secrets=secrets if name_suffix else None,
            extra_patches=(*patches, *(() if scheduled else (SUSPENDED,))))
    env_kubectl = Kubectl(str(cluster.kubectl), kubeconfig=str(cluster.kubeconfig))
    out = apply(env_kubectl, timeout=180, where=where)
    return Installation(cluster, namespace, dsn, identity, schema, name_suffix, out.stderr)


@contextlib.contextmanager
def keda_operator(cluster: ControlPlane, namespace: str) -> Iterator[Path]:
    """A KEDA operator (the one ``make cluster-up`` runs, devtools.cluster.keda) watching
    ``namespace`` only: a test module's own, so that no other test's ScaledJobs are scaled.
    Yields its log's path; stopped at the end."""
    from devtools.cluster.processes import stop

    where = cluster.plane.root / f"keda-{namespace}"
    proc, _ = cluster.plane.start_keda(where, watch_namespace=namespace,
                                       kubectl=cluster.kubectl)
    try:
        yield Path(proc.log)
    finally:
        stop(proc)
        (where / "process.json").unlink(missing_ok=True)


__all__ = [
    "NODE",
    "ControlPlane",
    "Installation",
    "delete_namespace",
    "install",
    "keda_operator",
    "new_namespace",
    "session_cluster",
    "wait_for",
]


# -- pods on a node no kubelet runs ----------------------------------------------------------

REMOTE_NODE = "elsewhere"
"""A node name no kubelet serves: a pod bound to it is never run here, and its status is what
the test writes, as that node's kubelet would (the API server does not check)."""

WORKER_LABELS = {"app.kubernetes.io/name": "jobfence", "app.kubernetes.io/component": "worker"}


def restricted_container(name: str = "jobfence", command: list[str] | None = None) -> Obj:
    """A container the restricted Pod Security Standard admits."""
    c: Obj = {"name": name, "image": IMAGE,
              "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                  "capabilities": {"drop": ["ALL"]}}}
    if command:
        c["command"] = command
    return c


def pod_body(name: str, *, labels: dict[str, str], node: str | None = None,
             command: list[str] | None = None, owner: Obj | None = None,
             finalizers: list[str] | None = None) -> Obj:
    meta: Obj = {"name": name, "labels": labels}
    if owner:
        # Not its controller: the Job controller would release (or, the Job being
        # suspended, delete) a pod it manages that its selector does not match.
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job",
                                    "controller": False, "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"]}]
    if finalizers:
        meta["finalizers"] = finalizers
    spec: Obj = {"restartPolicy": "Never", "automountServiceAccountToken": False,
                 "terminationGracePeriodSeconds": 5,
                 "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                     "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [restricted_container(command=command or ["sleep", "600"])]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def remote_pod(api: Rest, namespace: str, name: str, *, labels: dict[str, str],
               phase: str = "Running", started: str = "2026-01-01T00:00:00Z",
               owner: Obj | None = None) -> Obj:
    """A pod bound to a node no kubelet runs, its status ``phase`` since ``started``."""
    api.post(f"/api/v1/namespaces/{namespace}/pods",
             pod_body(name, labels=labels, node=REMOTE_NODE, owner=owner))
    return api.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                     {"status": {"phase": phase, "startTime": started}})


def suspended_job(api: Rest, namespace: str, name: str, *,
                  annotations: dict[str, str] | None = None) -> Obj:
    """A Job that starts no pod (suspended): an owner for remote pods."""
    return api.post(f"/apis/batch/v1/namespaces/{namespace}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"suspend": True, "template": {
            "spec": {k: v for k, v in pod_body(name, labels={})["spec"].items()
                     if k != "nodeName"}}}})


def token(cluster: ControlPlane, namespace: str, account: str) -> str:
    """A ServiceAccount's token, as `kubectl create token` asks for one."""
    with cluster.admin() as api:
        answer = api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                           "spec": {"expirationSeconds": 600}})
    return str(answer["status"]["token"])


def as_account(cluster: ControlPlane, namespace: str, account: str) -> Rest:
    """The API as a ServiceAccount, with its own token (the real authenticator and
    authorizer judge each call)."""
    return Rest(cluster.credentials().with_token(token(cluster, namespace, account)))


def can_i(cluster: ControlPlane, namespace: str, account: str, verb: str, resource: str,
          where: str | None = None) -> bool:
    """`kubectl auth can-i --as=system:serviceaccount:NS:ACCOUNT VERB RESOURCE -n WHERE`."""
    out = cluster.run("auth", "can-i", f"--as=system:serviceaccount:{namespace}:{account}",
                      verb, resource, "-n", where or namespace)
    assert out.stdout.strip() in ("yes", "no"), out.stdout + out.stderr
    return out.stdout.strip() == "yes"


def claim_as(dsn: str, pod: str, schema: str = "jobfence", **job: Any) -> str:
    """A job of the installation, claimed by the worker pod ``pod`` (as its worker would);
    the job's id."""
    from devtools.sqlconn import connect
    from jobfence.store import Store
    from tests.support.factories import enqueue_one

    with connect(dsn, schema=schema) as conn:
        store = Store(conn, schema)
        job_id = enqueue_one(store, **job)
        [claim] = store.attempts.claim(worker_id=pod, lease_seconds=3600)
        assert claim.job_id == job_id
    return str(job_id)


def enqueue_command(dsn: str, argv: list[str], schema: str = "jobfence", **job: Any) -> str:
    from devtools.sqlconn import connect
    from jobfence.store import Store
    from tests.support.factories import enqueue_one

    with connect(dsn, schema=schema) as conn:
        return str(enqueue_one(Store(conn, schema),
                               actions=[{"name": "command", "params": {"argv": argv}}], **job))


def pod_pids(cluster: ControlPlane, pod: Obj) -> set[int]:
    """The host PIDs of a pod's processes (its containers' and its sandbox's), from its
    cgroup on the node."""
    return wait_for(lambda: cluster.plane.node.pids_of_pod(pod["metadata"]["uid"]),
                    what="the pod's processes")


class LogFollower:
    """``kubectl logs -f`` of one container, from now until the container ends: what it
    wrote, even after the kubelet removed its files with the pod."""

    def __init__(self, cluster: ControlPlane, namespace: str, pod: str,
                 container: str) -> None:
        self._proc = subprocess.Popen(
            [str(cluster.kubectl), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace,
             "logs", "-f", pod, "-c", container], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        self._text: str | None = None

    def text(self, timeout: float = 60) -> str:
        if self._text is None:
            try:
                self._text, _ = self._proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._text, _ = self._proc.communicate()
        return self._text


def kubeconfig_for(cluster: ControlPlane, namespace: str, account: str, where: Path) -> Path:
    """A kubeconfig that reaches the API server with ``account``'s token."""
    creds = cluster.credentials()
    where.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": creds.server,
                                                "certificate-authority": creds.ca_file}}],
        "users": [{"name": account, "user": {"token": token(cluster, namespace, account)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": account}}]}))
    return where


def service_account(cluster: ControlPlane, namespace: str, name: str,
                    cluster_role: str | None = None) -> None:
    """A ServiceAccount, bound to ``cluster_role`` when given (a binding named after the
    namespace: cluster-scoped, it must not collide with another test's)."""
    with cluster.admin() as api:
        api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                 {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
        if cluster_role:
            api.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{namespace}-{name}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": cluster_role},
                "subjects": [{"kind": "ServiceAccount", "name": name,
                              "namespace": namespace}]})


def compact_etcd(cluster: ControlPlane) -> int:
    """Compact etcd at its current revision, as the API server does every five minutes:
    a list's continue token from before then has expired. The revision compacted at."""
    import base64
    import urllib.request

    def post(path: str, body: Obj) -> Obj:
        request = urllib.request.Request(
            f"http://127.0.0.1:{cluster.plane.ports.etcd}{path}", method="POST",
            data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            data: Obj = json.loads(resp.read())
            return data

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    revision = int(post("/v3/kv/range", {"key": b64("/")})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
    # What the API server's own compactor writes after compacting: every API server (and
    # its watch cache, within 15 s) learns the compacted revision from this key.
    post("/v3/kv/put", {"key": b64("compact_rev_key"), "value": b64(str(revision))})
    return revision
