"""The kustomize base renders offline and every built-in object is valid Kubernetes 1.32
(kubernetes-validate, strict: unknown fields and wrong types fail) — a quick check before
any server is involved; the negative tests prove it would catch an unknown field or a wrong
type. The custom objects (KEDA's ScaledJob and TriggerAuthentication, prometheus-operator's
PrometheusRule) are checked against their real CRDs by a real API server
(tests/cluster/test_manifests.py). The alerts' expressions are valid PromQL over the
metrics jobfence exports."""

from __future__ import annotations

import subprocess
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import yaml

from tests.support.manifests import (
    KUBERNETES_VERSION,
    METRICS,
    REPO,
    Obj,
    metric_names,
    of_kind,
    one,
    render,
)

BUILTIN = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Job", "CronJob"}
CUSTOM = {"ScaledJob", "TriggerAuthentication"}


def validate_builtin(obj: Obj) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def validate_custom(obj: Obj) -> None:
    """What can be checked of a custom object offline: its `metadata` as ObjectMeta and,
    for a ScaledJob, `jobTargetRef` as the batch/v1 JobSpec that it is."""
    validate_builtin({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})
    if obj["kind"] == "ScaledJob":
        validate_builtin({"apiVersion": "batch/v1", "kind": "Job",
                          "metadata": {"name": obj["metadata"]["name"]},
                          "spec": obj["spec"]["jobTargetRef"]})


def test_base_renders_with_every_expected_kind(base: list[Obj]) -> None:
    kinds = {o["kind"] for o in base}
    assert kinds == BUILTIN | CUSTOM
    assert all(o["metadata"].get("namespace") == "jobfence" for o in base)


def test_every_builtin_object_is_valid_kubernetes_strict(base: list[Obj]) -> None:
    builtin = [o for o in base if o["kind"] in BUILTIN]
    assert len(builtin) >= 12
    for obj in builtin:
        validate_builtin(obj)


def test_every_custom_objects_metadata_and_job_template_are_valid(base: list[Obj]) -> None:
    custom = [o for o in base if o["kind"] in CUSTOM]
    assert {o["kind"] for o in custom} == CUSTOM
    for obj in custom:
        validate_custom(obj)


def test_the_deploy_overlay_sets_namespace_and_image_and_stays_valid() -> None:
    """What `make deploy NAMESPACE=... IMAGE=...` applies, rendered by `make render`."""
    out = subprocess.run(["make", "-s", "render", "NAMESPACE=team-a",
                          "IMAGE=registry.example:5000/jobfence:9.9",
                          "OVERLAY=build/test-render-namespace"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    objects = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    assert len(objects) == len(render())
    assert {o["metadata"]["namespace"] for o in objects} == {"team-a"}
    assert {s["namespace"] for b in of_kind(objects, "RoleBinding")
            for s in b["subjects"]} == {"team-a"}
    images = {c["image"] for o in objects for c in containers_of(o)}
    assert images == {"registry.example:5000/jobfence:9.9"}
    for obj in objects:
        (validate_custom if obj["kind"] in CUSTOM else validate_builtin)(obj)


def containers_of(obj: Obj) -> list[Obj]:
    spec: Any = {"Job": lambda o: o["spec"]["template"],
                 "CronJob": lambda o: o["spec"]["jobTemplate"]["spec"]["template"],
                 "ScaledJob": lambda o: o["spec"]["jobTargetRef"]["template"]}.get(obj["kind"])
    return spec(obj)["spec"]["containers"] if spec else []


# -- the validation catches real mistakes --------------------------------------------------

def test_strict_validation_rejects_an_unknown_field_in_a_cronjob(objects: list[Obj]) -> None:
    cron = one(objects, "CronJob", "jobfence-sweeper")
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["restartPolicyy"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyy"):
        validate_builtin(cron)


def test_strict_validation_rejects_a_wrong_type(objects: list[Obj]) -> None:
    cron = one(objects, "CronJob", "jobfence-sweeper")
    cron["spec"]["startingDeadlineSeconds"] = "30"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_builtin(cron)


# -- alert expressions --------------------------------------------------------------------

def alert_rules(objects: list[Obj]) -> list[Obj]:
    rule = one(objects, "PrometheusRule")
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def test_every_alert_expression_is_valid_promql_over_the_pushed_metrics(
        with_alerts: list[Obj]) -> None:
    for rule in alert_rules(with_alerts):
        used = metric_names(promql_parser.parse(rule["expr"]))
        assert used, rule["alert"]
        assert used <= METRICS, (rule["alert"], used - METRICS)


def test_promql_check_rejects_a_syntax_error() -> None:
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("rate(jobfence_function_runs_total[5m]")


def test_every_alert_has_a_duration_a_severity_and_explanations(
        with_alerts: list[Obj]) -> None:
    names = set()
    for rule in alert_rules(with_alerts):
        names.add(rule["alert"])
        assert rule["for"], rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert {"JobfenceFunctionNotSucceeding", "JobfenceFunctionFailureRate",
            "JobfenceOrphanedPods", "JobfenceQueueOldestReadyAge"} <= names
