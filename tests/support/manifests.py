"""What the manifest tests share: the kustomize base (and the alerts component) rendered by
the kubectl built from the pinned sources, the pod templates in it, the contract's periodic
functions. The custom objects are checked against their real CRDs by a real API server in
tests/cluster/test_manifests.py."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from devtools import controlplane
from devtools.deploy import overlay
from jobfence.pools import Pools
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
