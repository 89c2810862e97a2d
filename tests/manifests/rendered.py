"""What the manifest tests share: the kustomize base rendered by kubectl, the pod templates
in it, the contract's periodic functions, and the vendored CRD schemas made strict."""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from jobfence.pools import Pools

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
CRDS = REPO / "tests" / "fixtures" / "crds"

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
}

# The vendored CRD of each custom kind the base uses (see tests/fixtures/crds/README.md).
CRD_FILES = {
    ("keda.sh/v1alpha1", "ScaledJob"): "keda.sh_scaledjobs.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
}

Obj = dict[str, Any]


@cache
def pools() -> Pools:
    """The pools the base ships (manifests/pools.yaml)."""
    return Pools.model_validate(yaml.safe_load((MANIFESTS / "pools.yaml").read_text()))


def kubectl_available() -> bool:
    return shutil.which("kubectl") is not None


def render(path: Path = MANIFESTS) -> list[Obj]:
    """`kubectl kustomize` of a kustomization directory, as a list of objects."""
    out = subprocess.run(["kubectl", "kustomize", str(path)], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


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


# -- CRD schemas ----------------------------------------------------------------------------

def strict(schema: Obj) -> Obj:
    """A CRD's structural schema as JSON Schema that rejects unknown fields, as the API
    server does for `kubectl apply` (field validation Strict): every object schema that
    lists its properties, and neither allows extra ones nor preserves unknown fields, gets
    `additionalProperties: false`. Objects without listed properties (e.g. `metadata`)
    stay open."""
    out = copy.copy(schema)
    if "properties" in out:
        out["properties"] = {k: strict(v) for k, v in out["properties"].items()}
        if ("additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(out["additionalProperties"])
    if "items" in out:
        out["items"] = strict(out["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [strict(s) for s in out[key]]
    return out


@cache
def crd(api_version: str, kind: str) -> Obj:
    """The vendored CRD that defines `kind` in `api_version`."""
    [doc] = [d for d in yaml.safe_load_all((CRDS / CRD_FILES[api_version, kind]).read_text())
             if d]
    return dict(doc)


def crd_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    definition = crd(api_version, kind)
    group, _, version = api_version.partition("/")
    assert definition["spec"]["group"] == group
    assert definition["spec"]["names"]["kind"] == kind
    [served] = [v for v in definition["spec"]["versions"] if v["name"] == version]
    return jsonschema.Draft202012Validator(strict(served["schema"]["openAPIV3Schema"]))
