"""What the base promises beyond schema validity: every periodic function of the reference
has a CronJob that cannot overlap itself and cannot run or linger forever; every pod runs
non-root on a read-only root filesystem with no capabilities, knows its own name and
namespace, gets the DSN only from the Secret, and carries the labels reconciliation relies
on; RBAC names every verb it grants; the KEDA objects are wired as the reference's KEDA
section says; no secret value is committed anywhere."""

from __future__ import annotations

import copy
import re
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import PurePosixPath

import pytest
import yaml

from jobfence.cluster import PERIODIC_FUNCTIONS, cronjob_name
from jobfence.db import queries
from jobfence.errors import InvalidSpec
from jobfence.functions.cli import COMMANDS
from jobfence.functions.pools import render as render_pools
from jobfence.spec import parse_spec_text
from tests.support.manifests import (
    PERIODIC,
    POLICIES,
    REPO,
    SIDECAR,
    Obj,
    containers,
    env_of,
    function_of,
    job_specs,
    of_kind,
    one,
    pod_templates,
    pools,
)

POOLS = pools()
# Pods that talk to the API server: the periodic functions (reconciliation and
# orphan-cleanup list and delete worker pods; each reads its own Job's annotations).
PERIODIC_CRONJOBS = {f"CronJob/jobfence-{name}" for name in PERIODIC}


def minutes_between_runs(schedule: str) -> int:
    """Minutes between two runs of the simple schedules the base uses."""
    minute = schedule.split(maxsplit=1)[0]
    if minute == "*":
        return 1
    match = re.fullmatch(r"\*/(\d+)", minute)
    assert match, f"unexpected schedule {schedule!r}"
    return int(match.group(1))


# -- CronJobs -----------------------------------------------------------------------------

def test_every_periodic_function_has_a_cronjob_on_its_schedule(base: list[Obj]) -> None:
    crons = {function_of(c): c for c in of_kind(base, "CronJob") if not c["spec"].get("suspend")}
    assert set(crons) == set(PERIODIC) == set(PERIODIC_FUNCTIONS)  # what a trigger may start
    for name, schedule in PERIODIC.items():
        assert crons[name]["metadata"]["name"] == f"jobfence-{name}" == cronjob_name(name)
        assert crons[name]["spec"]["schedule"] == schedule, name


@pytest.mark.parametrize("field", ["startingDeadlineSeconds", "successfulJobsHistoryLimit",
                                   "failedJobsHistoryLimit"])
def test_every_cronjob_sets_its_scheduling_bounds(base: list[Obj], field: str) -> None:
    for cron in of_kind(base, "CronJob"):
        assert isinstance(cron["spec"].get(field), int), (cron["metadata"]["name"], field)


def test_no_cronjob_can_overlap_itself(base: list[Obj]) -> None:
    for cron in of_kind(base, "CronJob"):
        assert cron["spec"]["concurrencyPolicy"] == "Forbid", cron["metadata"]["name"]


def test_every_cronjob_run_is_bounded_and_cleaned_up(base: list[Obj]) -> None:
    for cron in of_kind(base, "CronJob"):
        name, job = cron["metadata"]["name"], cron["spec"]["jobTemplate"]["spec"]
        assert isinstance(job.get("backoffLimit"), int) and job["backoffLimit"] <= 3, name
        assert job.get("activeDeadlineSeconds", 0) > 0, name
        assert job.get("ttlSecondsAfterFinished", 0) > 0, name
        assert job["template"]["spec"]["restartPolicy"] == "Never", name


def test_a_missed_tick_is_dropped_before_the_next_one_is_due(base: list[Obj]) -> None:
    """startingDeadlineSeconds below the interval: a late run never stacks onto the next;
    at least 10 s, the CronJob controller's own period, or runs may be missed."""
    for cron in of_kind(base, "CronJob"):
        if cron["spec"].get("suspend"):
            continue
        interval = 60 * minutes_between_runs(cron["spec"]["schedule"])
        assert 10 <= cron["spec"]["startingDeadlineSeconds"] < interval, cron["metadata"]["name"]


def test_every_cronjob_runs_its_own_function(base: list[Obj]) -> None:
    for cron in of_kind(base, "CronJob"):
        function = function_of(cron)
        assert cron["metadata"]["name"] == f"jobfence-{function}"
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == function


def test_every_function_in_the_manifests_is_a_command_of_the_cli(base: list[Obj]) -> None:
    used = {function_of(c) for c in of_kind(base, "CronJob")}
    used |= {str(c["args"][0]) for _, t in pod_templates(base) for c in containers(t)}
    missing = used - set(COMMANDS)
    assert not missing, f"not jobfence commands: {sorted(missing)}"


def test_enqueue_cronjob_is_a_suspended_template_for_manual_runs(base: list[Obj]) -> None:
    cron = one(base, "CronJob", "jobfence-enqueue")
    assert cron["spec"]["suspend"] is True
    job = cron["spec"]["jobTemplate"]["spec"]
    # A pod that died after its insert committed must not enqueue a second time.
    assert job["backoffLimit"] == 0
    [container] = job["template"]["spec"]["containers"]
    assert container["args"] == ["enqueue", "--spec", "/etc/jobfence/spec.yaml"]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/jobfence"]
    [volume] = [v for v in job["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    spec_map = one(base, "ConfigMap", volume["configMap"]["name"])
    [spec] = parse_spec_text(spec_map["data"]["spec.yaml"], "spec.yaml")
    assert spec.actions


def test_migration_job_runs_migrate_with_retries(base: list[Obj]) -> None:
    job = one(base, "Job", "jobfence-migrate")
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    assert job["spec"]["backoffLimit"] >= 1  # idempotent: a retry is safe
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["spec"]["activeDeadlineSeconds"] > 0 and job["spec"]["ttlSecondsAfterFinished"] > 0


def test_function_alert_thresholds_cover_every_function_and_outlast_a_run(
        base: list[Obj], with_alerts: list[Obj]) -> None:
    rule = one(with_alerts, "PrometheusRule")
    [alert] = [r for g in rule["spec"]["groups"] for r in g["rules"]
               if r["alert"] == "JobfenceFunctionNotSucceeding"]
    thresholds = {m[0]: int(m[1]) for m in re.findall(
        r'jobfence_function_last_success_timestamp_seconds\{function="([a-z-]+)"\}\s*>\s*(\d+)',
        alert["expr"])}
    assert set(thresholds) == set(PERIODIC)
    for cron in of_kind(base, "CronJob"):
        function = function_of(cron)
        if function not in PERIODIC:
            continue
        interval = 60 * minutes_between_runs(cron["spec"]["schedule"])
        deadline = cron["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"]
        # Several missed runs, and more than one long run plus the next tick.
        assert thresholds[function] >= 3 * interval, function
        assert thresholds[function] > deadline + interval, function


# -- every pod ----------------------------------------------------------------------------

def test_the_base_has_a_pod_template_per_function(base: list[Obj]) -> None:
    names = {where for where, _ in pod_templates(base)}
    assert names == PERIODIC_CRONJOBS | {"CronJob/jobfence-enqueue", "Job/jobfence-migrate",
                                *(f"ScaledJob/jobfence-worker-{p.name}" for p in POOLS.pools)}


@pytest.mark.parametrize("policy", POLICIES, ids=lambda f: f.__name__)
def test_the_base_meets_every_policy(base: list[Obj], policy: Callable[[list[Obj]], None]) -> None:
    """Every pod runs non-root on a read-only root filesystem with no capabilities, writes
    only to bounded volumes of its own, has requests and limits, knows its own name and
    namespace, takes its settings from the ConfigMap and the DSN only from its role's
    Secret, outlasts the worker's clean-up, carries the labels reconciliation relies on;
    no secret value is committed; RBAC is namespaced and names every verb (which verbs is
    tests/manifests/test_rbac.py's business). The checks are tests.support.manifests'
    ``POLICIES``, which the console's pod meets too (test_console_manifests.py)."""
    policy(base)


def test_a_worker_pods_commands_run_in_a_sidecar_that_holds_no_key(base: list[Obj]) -> None:
    """The command sidecar: a native sidecar (an init container that keeps running) with no
    Secret, no configuration, no API token, its own PID namespace and a uid of its own; it
    dials the worker's socket in a volume the worker alone writes (mounted read-only in the
    sidecar), the only volume both mount; the worker takes its connection from that uid
    only."""
    workers = 0
    for where, template in pod_templates(base):
        spec = template["spec"]
        if not where.startswith("ScaledJob/"):
            assert not spec.get("initContainers"), where
            continue
        workers += 1
        [sidecar] = spec["initContainers"]
        [worker] = spec["containers"]
        assert sidecar["name"] == SIDECAR and sidecar["restartPolicy"] == "Always", where
        assert sidecar["args"][:2] == ["command-runner", "--socket"], where
        socket = sidecar["args"][2]
        assert sidecar["args"][3:] == ["--scratch", "/tmp"], where
        env = env_of(worker)
        assert env["JOBFENCE_COMMAND_SOCKET"]["value"] == socket, where
        assert "env" not in sidecar and "envFrom" not in sidecar, where
        runner_uid = sidecar["securityContext"]["runAsUser"]
        assert runner_uid not in (0, spec["securityContext"]["runAsUser"]), where
        assert worker["securityContext"].get("runAsUser") in (
            None, spec["securityContext"]["runAsUser"]), where
        assert env["JOBFENCE_COMMAND_RUNNER_UID"]["value"] == str(runner_uid), where
        shared = [m for m in sidecar["volumeMounts"]
                  if m["name"] in {w["name"] for w in worker["volumeMounts"]}]
        [control] = shared
        assert control["readOnly"] is True, where
        assert socket.startswith(control["mountPath"] + "/"), where
        # The socket's own directory is made by the worker (the emptyDir's root is 0777).
        assert PurePosixPath(socket).parent != PurePosixPath(control["mountPath"]), where
        assert all(set(v) == {"name", "emptyDir"} for v in spec["volumes"]), where
        assert not spec.get("shareProcessNamespace"), where
        assert "fsGroup" not in spec["securityContext"], where  # no group both share
        assert spec["automountServiceAccountToken"] is False, where
    assert workers == len(POOLS.pools)


def test_every_container_runs_the_one_jobfence_image(base: list[Obj]) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for where, template in pod_templates(base):
        for c in containers(template):
            assert c["image"] == f"jobfence:{version}", where
            assert "command" not in c, where  # the image's ENTRYPOINT is `jobfence`


# -- the worker pools -----------------------------------------------------------------------

def test_the_generated_pools_are_the_pools_file_rendered() -> None:
    """pools.generated.yaml is `jobfence pools render pools.yaml` (`make pools`): a pool
    edited without rendering again fails here, not in the cluster."""
    generated = (REPO / "manifests" / "pools.generated.yaml").read_text()
    assert generated == render_pools((REPO / "manifests" / "pools.yaml").read_text())


def test_the_base_ships_a_one_job_pool_and_a_draining_pool(base: list[Obj]) -> None:
    by_queue = {p.queue: p for p in POOLS.pools}
    assert by_queue["default"].mode == "one-per-pod"
    assert by_queue["datums"].mode == "draining"
    for pool in POOLS.pools:
        scaled = one(base, "ScaledJob", f"jobfence-worker-{pool.name}")
        [container] = scaled["spec"]["jobTargetRef"]["template"]["spec"]["containers"]
        assert container["args"][:3] == ["worker", "--queue", pool.queue]
        assert ("--max-jobs" in container["args"]) == (pool.mode == "draining")
        assert scaled["spec"]["maxReplicaCount"] == pool.max_pods
        [sidecar] = scaled["spec"]["jobTargetRef"]["template"]["spec"]["initContainers"]
        assert sidecar["resources"] == pool.resources  # the job's commands run there
        labels = scaled["spec"]["jobTargetRef"]["template"]["metadata"]["labels"]
        assert labels["jobfence.io/queue"] == pool.queue
        assert labels["jobfence.io/pool"] == pool.name


def test_every_pool_query_is_the_scaler_value_statement_for_its_queue(
        base: list[Obj]) -> None:
    expected = queries("jobfence.store", "queues.sql", "jobfence")["scaler_value"]
    for pool in POOLS.pools:
        [trigger] = one(base, "ScaledJob", f"jobfence-worker-{pool.name}")["spec"]["triggers"]
        literal = "'" + pool.queue + "'"
        assert normalized(trigger["metadata"]["query"]) == normalized(
            expected.replace("{queue}", literal))


def test_pools_differ_only_where_the_pools_file_says(base: list[Obj]) -> None:
    """Every pool has the worker's security context, downward API, DSN and volumes: only
    name, labels, queue, image, resources, size, budgets and query differ."""
    scaled = {p.name: one(base, "ScaledJob", f"jobfence-worker-{p.name}") for p in POOLS.pools}

    def skeleton(obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        obj.pop("metadata")
        spec = obj["spec"]
        for key in ("maxReplicaCount", "pollingInterval"):
            spec.pop(key)
        template = spec["jobTargetRef"]["template"]
        for key in ("jobfence.io/pool", "jobfence.io/queue"):
            template["metadata"]["labels"].pop(key)
        [container] = template["spec"]["containers"]
        for key in ("args", "image"):
            container.pop(key)
        [sidecar] = template["spec"]["initContainers"]
        for key in ("resources", "image"):
            sidecar.pop(key)
        [trigger] = spec["triggers"]
        trigger.pop("name")
        trigger["metadata"].pop("query")
        trigger["metadata"].pop("targetQueryValue")  # the pool's concurrency
        return obj

    first, *rest = scaled.values()
    for other in rest:
        assert skeleton(other) == skeleton(first)


def test_kubernetes_never_stops_a_worker_pod_on_a_deadline(base: list[Obj]) -> None:
    """A draining pod stops claiming at its budget and its job in hand runs to its end: a
    Job deadline would SIGTERM it mid-job (the job given back, the work lost)."""
    for scaled in of_kind(base, "ScaledJob"):
        assert "activeDeadlineSeconds" not in scaled["spec"]["jobTargetRef"]


@pytest.mark.parametrize("text, error", [
    ("pools: []", "at least 1 item"),
    ("pools: [{name: a}, {name: a}]", "same name"),
    ("pools: [{name: a, queue: x}, {name: b, queue: x}]", "same queue"),
    ("pools: [{name: Bad}]", "should match pattern"),
    ("pools: [{name: a, mode: forever}]", "one-per-pod"),
    ("pools: [{name: a, maxPods: 0}]", "greater than or equal to 1"),
    ("pools: [{name: a, queue: 'not a queue'}]", "queue"),
    ("pools: [{name: a, colour: red}]", "Extra inputs"),
    ("pools: [{name: a}", "pools file"),
])
def test_a_bad_pools_file_is_refused(text: str, error: str) -> None:
    with pytest.raises(InvalidSpec, match=error):
        render_pools(text)


# -- the KEDA worker ----------------------------------------------------------------------

def normalized(sql: str) -> str:
    return " ".join(sql.split()).rstrip(";").strip()


def test_scaledjob_uses_the_default_strategy_with_explicit_limits(base: list[Obj]) -> None:
    for scaled in of_kind(base, "ScaledJob"):
        spec = scaled["spec"]
        # KEDA 2.20.0 and 2.20.1 reject an explicit `strategy: default`.
        assert "strategy" not in spec.get("scalingStrategy", {})
        for field in ("pollingInterval", "maxReplicaCount", "successfulJobsHistoryLimit",
                      "failedJobsHistoryLimit"):
            assert isinstance(spec.get(field), int) and spec[field] > 0, field
        assert spec.get("minReplicaCount", 0) == 0


def test_a_deploy_lets_running_workers_finish(base: list[Obj]) -> None:
    """KEDA's default rollout deletes the running Jobs when the ScaledJob changes: every
    deploy would kill the jobs in flight and spend one of their attempts."""
    for scaled in of_kind(base, "ScaledJob"):
        spec = scaled["spec"]
        assert spec["rollout"]["strategy"] == "gradual"
        assert "rolloutStrategy" not in spec  # the deprecated spelling


def test_scaledjob_runs_one_pod_without_kubernetes_retries(base: list[Obj]) -> None:
    for scaled in of_kind(base, "ScaledJob"):
        target = scaled["spec"]["jobTargetRef"]
        assert target["backoffLimit"] == 0
        assert target.get("parallelism", 1) == 1 and target.get("completions", 1) == 1
        pod = target["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        assert pod["terminationGracePeriodSeconds"] == 30
    default = one(base, "ScaledJob", "jobfence-worker-default")["spec"]["jobTargetRef"]
    [container] = default["template"]["spec"]["containers"]
    assert container["args"] == ["worker", "--queue", "default"]


def test_scaledjob_trigger_is_postgresql_with_string_metadata(base: list[Obj]) -> None:
    for scaled in of_kind(base, "ScaledJob"):
        [trigger] = scaled["spec"]["triggers"]
        assert trigger["type"] == "postgresql"
        metadata = trigger["metadata"]
        assert all(isinstance(v, str) for v in metadata.values()), metadata
        pool = scaled["metadata"]["labels"]["jobfence.io/pool"]
        [declared] = [p for p in POOLS.pools if p.name == pool]
        assert metadata["targetQueryValue"] == str(declared.concurrency)
        assert metadata["activationTargetQueryValue"] == "0"
        assert set(metadata) == {"query", "targetQueryValue", "activationTargetQueryValue"}


def test_trigger_authentication_runs_as_the_scaler_role(base: list[Obj]) -> None:
    for scaled in of_kind(base, "ScaledJob"):
        [trigger] = scaled["spec"]["triggers"]
        auth = one(base, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        assert trigger["authenticationRef"].get("kind", "TriggerAuthentication") == \
            "TriggerAuthentication"
        assert auth["spec"] == {"secretTargetRef": [
            {"parameter": "connection", "name": "jobfence-database-scaler", "key": "url"}]}


def test_every_job_spec_is_a_single_pod_run(base: list[Obj]) -> None:
    for where, spec in job_specs(base):
        assert spec.get("parallelism", 1) == 1 and spec.get("completions", 1) == 1, where
        assert spec["template"]["spec"]["restartPolicy"] == "Never", where


# -- the installation's identity -------------------------------------------------------------

def installation_label(obj: Obj) -> str:
    labels = obj["spec"]["jobTargetRef"]["template"]["metadata"]["labels"]
    return str(labels["jobfence.io/installation"])


def test_every_worker_pod_carries_the_configured_installation(base: list[Obj]) -> None:
    value = one(base, "ConfigMap", "jobfence-config")["data"]["JOBFENCE_INSTALLATION"]
    for scaled in of_kind(base, "ScaledJob"):
        assert installation_label(scaled) == value
        [worker] = scaled["spec"]["jobTargetRef"]["template"]["spec"]["containers"]
        [env] = [e for e in worker["env"] if e["name"] == "JOBFENCE_INSTALLATION"]
        # The worker claims for the installation its own label says: never another.
        assert env["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.labels['jobfence.io/installation']"


def test_make_deploy_installation_relabels_every_worker_pod() -> None:
    out = subprocess.run(["make", "-s", "render", "INSTALLATION=staging",
                          "OVERLAY=build/test-render-installation"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    objects = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    assert one(objects, "ConfigMap", "jobfence-config")["data"][
        "JOBFENCE_INSTALLATION"] == "staging"
    assert {installation_label(o) for o in of_kind(objects, "ScaledJob")} == {"staging"}
