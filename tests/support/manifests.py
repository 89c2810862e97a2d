"""What the manifest tests share: the kustomize base (and the alerts component) rendered by
the kubectl built from the pinned sources, the pod templates in it, the contract's periodic
functions; the Kubernetes verbs the code calls and those a ServiceAccount is granted; the
policies every pod of the base meets (tests/manifests/test_policies.py applies them to the
base, test_console_manifests.py to the console's pod); the metrics a PromQL expression
selects. The custom objects are checked against their real CRDs by a real API server in
tests/cluster/test_manifests.py."""

from __future__ import annotations

import inspect
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import promql_parser
import yaml

from devtools import controlplane
from devtools.deploy import overlay
from jobfence.adapters.kube import KubernetesCluster
from jobfence.cluster import Cluster
from jobfence.passes.harness import Deps
from jobfence.pools import Pools
from jobfence.store.roles import ROLE_OF_COMMAND
from jobfence.worker.loop import EXIT_GRACE_SECONDS
from tests.support import REPO

MANIFESTS = REPO / "manifests"
RUNBOOK_URL = "https://docs.example/jobfence/docs/RUNBOOK.md"

# kubernetes-validate ships schemas for 1.25-1.37; 1.32 is the kubectl on our machines.
KUBERNETES_VERSION = "1.32"

# docs/REFERENCE.md, "Entrypoints": the functions started by a CronJob, with their schedules.
PERIODIC: dict[str, str] = {
    "sweeper": "* * * * *",
    "reconciliation": "*/2 * * * *",
    "export-finalize": "* * * * *",
    "lifecycle": "*/5 * * * *",
    "orphan-cleanup": "*/10 * * * *",
    "schedules": "* * * * *",
}

# Every metric jobfence exports (the names the alerts and dashboards may use); a test in
# tests/acceptance/test_metrics.py checks that `jobfence metrics` shows exactly these.
METRICS = {
    "jobfence_function_health",
    "jobfence_function_consecutive_failures",
    "jobfence_function_snapshot",
    "jobfence_metrics_collected_timestamp_seconds",
    "jobfence_jobs_finished_total",
    "jobfence_job_attempts_total",
    "jobfence_job_stops_total",
    "jobfence_job_wait_seconds_bucket",
    "jobfence_job_wait_seconds_count",
    "jobfence_job_wait_seconds_sum",
    "jobfence_job_run_seconds_bucket",
    "jobfence_job_run_seconds_count",
    "jobfence_job_run_seconds_sum",
    "jobfence_database_up",
    "jobfence_function_runs_total",
    "jobfence_function_last_success_timestamp_seconds",
    "jobfence_function_last_duration_seconds",
    "jobfence_function_items_total",
    "jobfence_jobs",
    "jobfence_jobs_scheduled",
    "jobfence_queue_oldest_ready_age_seconds",
    "jobfence_queue_paused",
    "jobfence_queue_limit",
    "jobfence_queue_rate_limit",
    "jobfence_queue_rate_period_seconds",
    "jobfence_queue_rate_started",
    "jobfence_draining",
    "jobfence_database_connections",
    "jobfence_database_connections_available",
    "jobfence_function_duration_seconds_bucket",
    "jobfence_function_duration_seconds_count",
    "jobfence_function_duration_seconds_sum",
    "jobfence_lifecycle_lag_seconds_bucket",
    "jobfence_lifecycle_lag_seconds_count",
    "jobfence_lifecycle_lag_seconds_sum",
    "jobfence_parent_finalize_lag_seconds_bucket",
    "jobfence_parent_finalize_lag_seconds_count",
    "jobfence_parent_finalize_lag_seconds_sum",
    "jobfence_lifecycle_overdue_seconds",
    "jobfence_action_runs_total",
    *(f"jobfence_action_{h}_{part}" for h in ("run_seconds", "cpu_seconds", "peak_memory_bytes")
      for part in ("bucket", "count", "sum")),
}

Obj = dict[str, Any]


@cache
def pools() -> Pools:
    """The pools the base ships (manifests/pools.yaml)."""
    return Pools.model_validate(yaml.safe_load((MANIFESTS / "pools.yaml").read_text()))


def kubectl() -> str:
    """The kubectl built from devtools/controlplane (`make controlplane`)."""
    return str(controlplane.path("kubectl"))


def render(path: Path = MANIFESTS) -> list[Obj]:
    """`kubectl kustomize` of a kustomization directory, as a list of objects."""
    out = subprocess.run([kubectl(), "kustomize", str(path)], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def render_with(*components: str, **settings: Any) -> list[Obj]:
    """The base with optional components, as `make deploy COMPONENTS=...` renders it."""
    REPO.joinpath("build").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=REPO / "build", prefix="render-") as tmp:
        settings.setdefault("runbook_url", RUNBOOK_URL)
        settings.setdefault("namespace", "jobfence")
        overlay(image="localhost/jobfence:0.1.0", components=components, where=Path(tmp),
                **settings)
        return render(Path(tmp))


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objects if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def pod_templates(objects: list[Obj]) -> Iterator[tuple[str, Obj]]:
    """Every pod template in the base, named `Kind/name`: Jobs, CronJobs, the ScaledJob."""
    for o in objects:
        where = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] == "Job":
            yield where, o["spec"]["template"]
        elif o["kind"] == "CronJob":
            yield where, o["spec"]["jobTemplate"]["spec"]["template"]
        elif o["kind"] == "ScaledJob":
            yield where, o["spec"]["jobTargetRef"]["template"]


def job_specs(objects: list[Obj]) -> Iterator[tuple[str, Obj]]:
    """Every Job spec: the Job's, each CronJob's job template, the ScaledJob's target."""
    for o in objects:
        where = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] == "Job":
            yield where, o["spec"]
        elif o["kind"] == "CronJob":
            yield where, o["spec"]["jobTemplate"]["spec"]
        elif o["kind"] == "ScaledJob":
            yield where, o["spec"]["jobTargetRef"]


def function_of(cronjob: Obj) -> str:
    """The jobfence command a CronJob runs (its container's first argument)."""
    [container] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return str(container["args"][0])


# -- RBAC: the verbs the code calls, the verbs an account is granted ----------------------

PORT = {name for name, _ in inspect.getmembers(Cluster, inspect.isfunction)
        if not name.startswith("_")}
API_CALL = re.compile(r"self\.(core|batch)\.(list|read|delete|create|patch)_namespaced_(\w+)\(")
VERB = {"read": "get"}
GROUP = {"core": "", "batch": "batch"}

Rule = tuple[str, str, str]
"""(apiGroup, resource, verb)"""


def api_rules(method: str) -> set[Rule]:
    """(apiGroup, resource, verb) of each API call a method of the adapter makes."""
    source = inspect.getsource(getattr(KubernetesCluster, method))
    return {(GROUP[api], f"{kind.replace('_', '')}s", VERB.get(op, op))
            for api, op, kind in API_CALL.findall(source)}


def port_calls(source: str) -> set[str]:
    """The methods of the cluster port that ``source`` calls (a pod snapshot's included)."""
    called = {m for m in re.findall(r"\.(\w+)\(", source) if m in PORT}
    if ".pod_snapshot(" in source:
        called |= port_calls(inspect.getsource(Deps.pod_snapshot))
    return called


def granted(base: list[Obj], account: str) -> set[Rule]:
    """What the Roles bound to ServiceAccount ``account`` grant (no cluster-wide binding)."""
    roles = {b["roleRef"]["name"] for b in of_kind(base, "RoleBinding")
             if any(s["kind"] == "ServiceAccount" and s["name"] == account
                    for s in b["subjects"])}
    assert not of_kind(base, "ClusterRoleBinding")
    return {(group, resource, verb)
            for r in of_kind(base, "Role") if r["metadata"]["name"] in roles
            for rule in r["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


# -- PromQL (alerts, dashboards) ----------------------------------------------------------

def metric_names(node: Any) -> set[str]:
    """Every metric a PromQL expression selects, walking promql_parser's syntax tree."""
    if isinstance(node, promql_parser.VectorSelector):
        return {node.name} if node.name else set()
    if isinstance(node, promql_parser.MatrixSelector):
        return metric_names(node.vector_selector)
    if isinstance(node, promql_parser.BinaryExpr):
        return metric_names(node.lhs) | metric_names(node.rhs)
    if isinstance(node, promql_parser.Call):
        return set().union(*(metric_names(a) for a in node.args))
    if isinstance(node, promql_parser.AggregateExpr | promql_parser.ParenExpr
                  | promql_parser.UnaryExpr | promql_parser.SubqueryExpr):
        return metric_names(node.expr)
    return set()


# -- the policies every pod of the base meets ----------------------------------------------

APP_LABELS = {"app.kubernetes.io/name": "jobfence", "app.kubernetes.io/part-of": "jobfence"}

SIDECAR = "command-runner"
"""A worker pod's command sidecar (jobfence.worker.sidecar): no function, no settings, no key."""


def containers(template: Obj) -> list[Obj]:
    spec = template["spec"]
    return list(spec["containers"]) + list(spec.get("initContainers", []))


def function_containers(template: Obj) -> list[Obj]:
    """The containers that run a function (all but the command sidecar)."""
    return [c for c in containers(template) if c["name"] != SIDECAR]


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


def every_pod_runs_non_root_with_runtime_default_seccomp(base: list[Obj]) -> None:
    for where, template in pod_templates(base):
        sc = template["spec"]["securityContext"]
        assert sc["runAsNonRoot"] is True, where
        assert sc["runAsUser"] != 0 and sc.get("runAsGroup", 1) != 0, where
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where


def every_container_is_read_only_without_capabilities(base: list[Obj]) -> None:
    for where, template in pod_templates(base):
        for c in containers(template):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert not sc["capabilities"].get("add"), where
            assert not sc.get("privileged"), where
            assert sc.get("runAsNonRoot", True) is True, where


def every_pod_writes_only_to_bounded_emptydirs_of_its_own(base: list[Obj]) -> None:
    """Each container writes to its own /tmp (an emptyDir with a size limit) and, for a
    worker, to the directory it listens in for its sidecar; no volume is writable by two
    containers."""
    for where, template in pod_templates(base):
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        writers: dict[str, list[str]] = {}
        for c in containers(template):
            [tmp] = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            writable = [m for m in c["volumeMounts"] if not m.get("readOnly")]
            assert tmp in writable, where
            for m in writable:
                assert volumes[m["name"]]["emptyDir"].get("sizeLimit"), (where, m)
                writers.setdefault(m["name"], []).append(c["name"])
        assert all(len(w) == 1 for w in writers.values()), (where, writers)


def every_container_has_requests_and_limits(base: list[Obj]) -> None:
    for where, template in pod_templates(base):
        for c in containers(template):
            for bound in ("requests", "limits"):
                assert set(c["resources"][bound]) >= {"cpu", "memory"}, (where, bound)


def every_pod_knows_its_name_and_namespace(base: list[Obj]) -> None:
    expected = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
                "JOBFENCE_NAMESPACE": "metadata.namespace"}
    for where, template in pod_templates(base):
        for c in function_containers(template):
            env = env_of(c)
            for name, field in expected.items():
                assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == field, (where, name)


def every_pod_takes_its_settings_from_the_configmap(base: list[Obj]) -> None:
    config = one(base, "ConfigMap", "jobfence-config")["data"]
    assert config["JOBFENCE_CLUSTER"] == "kubernetes"
    assert config["JOBFENCE_LOG_FORMAT"] == "json"
    for key in ("JOBFENCE_LEASE_SECONDS", "JOBFENCE_MAX_ATTEMPTS",
                "JOBFENCE_RETRY_BASE_SECONDS", "JOBFENCE_S3_BUCKET"):
        assert config[key], key
    for where, template in pod_templates(base):
        for c in function_containers(template):
            assert {"configMapRef": {"name": "jobfence-config"}} in c["envFrom"], where


def the_dsn_comes_only_from_the_secret_of_the_functions_role(base: list[Obj]) -> None:
    """One Secret per database role, referenced by exactly the pods whose function runs as
    that role (jobfence.store.roles.ROLE_OF_COMMAND); KEDA runs its query as the scaler."""
    used: dict[str, set[str]] = {}
    for where, template in pod_templates(base):
        for c in function_containers(template):
            role = ROLE_OF_COMMAND[c["args"][0]]
            secret = f"jobfence-database-{role}"
            dsn = env_of(c)["JOBFENCE_DATABASE_URL"]
            assert dsn == {"name": "JOBFENCE_DATABASE_URL", "valueFrom": {
                "secretKeyRef": {"name": secret, "key": "url"}}}, where
            used.setdefault(role, set()).add(c["args"][0])
    assert set(used) == {"owner", "worker", "maintainer", "operator"}
    [auth] = of_kind(base, "TriggerAuthentication")
    assert [r["name"] for r in auth["spec"]["secretTargetRef"]] == ["jobfence-database-scaler"]
    for config in of_kind(base, "ConfigMap"):
        assert "JOBFENCE_DATABASE_URL" not in config["data"]


def no_secret_values_are_committed(base: list[Obj]) -> None:
    assert not [o for o in base if o["kind"] == "Secret"]
    dsn_like = re.compile(r"postgres(ql)?://|password\s*=|\bsslpassword\b", re.IGNORECASE)

    def scan(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                assert key not in {"stringData"}, path
                scan(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                scan(value, f"{path}[{i}]")
        elif isinstance(node, str):
            assert not dsn_like.search(node), f"{path} looks like a credential: {node!r}"

    for obj in base:
        scan(obj, f"{obj['kind']}/{obj['metadata']['name']}")
    # A credential never comes as a plain value, only through a reference.
    credential = re.compile("SECRET|PASSWORD|TOKEN|KEY|DATABASE_URL")
    for where, template in pod_templates(base):
        for c in containers(template):
            plain = [e["name"] for e in c.get("env", []) if "value" in e]
            assert not [n for n in plain if credential.search(n)], where
    for config in of_kind(base, "ConfigMap"):
        assert not [k for k in config["data"] if credential.search(k)], config["metadata"]


def termination_grace_outlasts_the_worker_clean_up(base: list[Obj]) -> None:
    for where, template in pod_templates(base):
        grace = template["spec"]["terminationGracePeriodSeconds"]
        assert grace > EXIT_GRACE_SECONDS + 5, where


def every_pod_carries_the_app_labels_and_its_component(base: list[Obj]) -> None:
    for where, template in pod_templates(base):
        labels = template["metadata"]["labels"]
        assert labels.items() >= APP_LABELS.items(), where
        assert labels["app.kubernetes.io/component"], where


def every_object_carries_the_app_labels(base: list[Obj]) -> None:
    for obj in base:
        labels = obj["metadata"].get("labels", {})
        assert labels.items() >= APP_LABELS.items(), obj["metadata"]["name"]


def worker_pods_match_the_selector_reconciliation_uses(base: list[Obj]) -> None:
    selector = one(base, "ConfigMap", "jobfence-config")["data"]["JOBFENCE_WORKER_SELECTOR"]
    assert selector == "app.kubernetes.io/name=jobfence,app.kubernetes.io/component=worker"
    wanted = dict(term.split("=", 1) for term in selector.split(","))
    for where, template in pod_templates(base):
        labels = template["metadata"]["labels"]
        matches = labels.items() >= wanted.items()
        assert matches == where.startswith("ScaledJob/jobfence-worker-"), where


def rbac_is_namespaced_and_names_every_verb(base: list[Obj]) -> None:
    """Which verbs each ServiceAccount gets is tests/manifests/test_rbac.py's business;
    here: nothing cluster-wide, no wildcard, each binding to its own account here."""
    assert not of_kind(base, "ClusterRole") and not of_kind(base, "ClusterRoleBinding")
    for role in of_kind(base, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], rule
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
    for binding in of_kind(base, "RoleBinding"):
        name = binding["metadata"]["name"]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                      "kind": "Role", "name": name}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name,
                                        "namespace": "jobfence"}]


POLICIES: list[Callable[[list[Obj]], None]] = [
    every_pod_runs_non_root_with_runtime_default_seccomp,
    every_container_is_read_only_without_capabilities,
    every_pod_writes_only_to_bounded_emptydirs_of_its_own,
    every_container_has_requests_and_limits,
    every_pod_knows_its_name_and_namespace,
    every_pod_takes_its_settings_from_the_configmap,
    the_dsn_comes_only_from_the_secret_of_the_functions_role,
    no_secret_values_are_committed,
    termination_grace_outlasts_the_worker_clean_up,
    every_pod_carries_the_app_labels_and_its_component,
    every_object_carries_the_app_labels,
    worker_pods_match_the_selector_reconciliation_uses,
    rbac_is_namespaced_and_names_every_verb,
]
"""What every pod and object of the base meets, each a check of a list of objects:
test_policies applies them to the base, test_console_manifests to the console's
objects (its Deployment's pod as a pod of the base)."""
