"""Every shipped manifest and component, applied server-side by the real API server into a
namespace labelled for the ``restricted`` Pod Security level: accepted, with no warning
(the PodSecurity admission warns about a workload's pod template that would violate it),
and their custom objects valid against the real CRDs (KEDA 2.20, prometheus-operator) —
which also refuse what the base must never contain: a trigger value that is not a string,
an unknown field anywhere, a malformed alert duration."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from devtools.cluster.rest import ApiError, Rest
from tests.support.kube import ControlPlane, install
from tests.support.manifests import Obj, one, render_with

ALL = ("alerts", "console", "metrics-exporter", "grafana-dashboards")


def test_the_base_and_every_component_are_accepted_without_a_warning(
        kube: ControlPlane, namespace: str, dsn: str) -> None:
    """`make deploy`'s own path (its checks, server-side apply, the migration Job) with every
    optional component, into a restricted namespace. (Under a nameSuffix: the console's
    ClusterRoleBinding is cluster-wide, and tests/cluster/test_console.py has the name.)"""
    inst = install(kube, namespace, dsn, components=ALL, name_suffix="-all")
    assert "Warning" not in inst.applied, inst.applied
    paths = ("/apis/batch/v1/namespaces/{ns}/cronjobs",
             "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledjobs",
             "/apis/keda.sh/v1alpha1/namespaces/{ns}/triggerauthentications",
             "/apis/monitoring.coreos.com/v1/namespaces/{ns}/prometheusrules",
             "/apis/apps/v1/namespaces/{ns}/deployments",
             "/api/v1/namespaces/{ns}/services",
             "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets")
    with kube.admin() as api:
        for path in paths:
            assert api.get(path.format(ns=namespace))["items"], path
        assert api.exists("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/"
                          "jobfence-console-auth-delegator-all")
    # The migration Job's pod ran under the restricted level's enforcement.
    [pod] = inst.pods_of_job("jobfence-migrate-all")
    assert pod["status"]["phase"] == "Succeeded"


def test_the_proxied_console_is_accepted(kube: ControlPlane, namespace: str) -> None:
    objects = render_with("console", "console/proxy", namespace=namespace,
                          name_suffix="-proxied")
    objects = [o for o in objects if o["kind"] in (
        "Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "ServiceAccount",
        "Role", "RoleBinding", "ConfigMap")]
    out = kube.run("apply", "--server-side", "--field-manager=jobfence-deploy", "-f", "-",
                   input=_yaml(objects))
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr
    assert "networkpolicy.networking.k8s.io/jobfence-console" in out.stdout


# -- the real CRDs refuse what the base must never contain -----------------------------------


@pytest.fixture(scope="module")
def shipped() -> list[Obj]:
    return render_with("alerts")


def refused(kube: ControlPlane, namespace: str, obj: Obj) -> ApiError:
    """Created with dry run and strict field validation, as `kubectl apply` validates."""
    group_version = obj["apiVersion"]
    plural = {"ScaledJob": "scaledjobs", "TriggerAuthentication": "triggerauthentications",
              "PrometheusRule": "prometheusrules", "CronJob": "cronjobs"}[obj["kind"]]
    prefix = "/apis/" + group_version
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    with kube.admin() as api, pytest.raises(ApiError) as caught:
        api.post(f"{prefix}/namespaces/{namespace}/{plural}", obj, dryRun="All",
                 fieldValidation="Strict")
    return caught.value


def accepted(api: Rest, namespace: str, obj: Obj, plural: str) -> None:
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    api.post(f"/apis/{obj['apiVersion']}/namespaces/{namespace}/{plural}", obj, dryRun="All",
             fieldValidation="Strict")


def test_the_shipped_custom_objects_pass_strict_validation(
        kube: ControlPlane, namespace: str, shipped: list[Obj]) -> None:
    with kube.admin() as api:
        for obj in shipped:
            plural = {"ScaledJob": "scaledjobs",
                      "TriggerAuthentication": "triggerauthentications",
                      "PrometheusRule": "prometheusrules"}.get(obj["kind"])
            if plural:
                accepted(api, namespace, obj, plural)


def test_a_numeric_trigger_metadata_value_is_refused(
        kube: ControlPlane, namespace: str, shipped: list[Obj]) -> None:
    scaled = copy.deepcopy(one(shipped, "ScaledJob", "jobfence-worker-default"))
    scaled["spec"]["triggers"][0]["metadata"]["targetQueryValue"] = 1
    err = refused(kube, namespace, scaled)
    assert err.status == 422 and "targetQueryValue" in str(err)


@pytest.mark.parametrize("path", [
    ("spec", "scalingStrategyy"),
    ("spec", "triggers", 0, "queryy"),
    ("spec", "jobTargetRef", "template", "spec", "containers", 0, "argz"),
    ("spec", "triggers", 0, "authenticationRef", "namespacee"),
])
def test_an_unknown_scaledjob_field_is_refused(
        kube: ControlPlane, namespace: str, shipped: list[Obj], path: tuple[Any, ...]) -> None:
    scaled = copy.deepcopy(one(shipped, "ScaledJob", "jobfence-worker-default"))
    node: Any = scaled
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = "x"
    err = refused(kube, namespace, scaled)
    assert "unknown field" in str(err) and str(path[-1]) in str(err), err


def test_a_trigger_authentication_without_its_key_is_refused(
        kube: ControlPlane, namespace: str, shipped: list[Obj]) -> None:
    auth = copy.deepcopy(one(shipped, "TriggerAuthentication"))
    del auth["spec"]["secretTargetRef"][0]["key"]
    err = refused(kube, namespace, auth)
    assert err.status == 422 and "key" in str(err)


def test_a_malformed_alert_duration_is_refused(
        kube: ControlPlane, namespace: str, shipped: list[Obj]) -> None:
    rule = copy.deepcopy(one(shipped, "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    err = refused(kube, namespace, rule)
    assert err.status == 422 and "for" in str(err)


def test_an_unknown_metadata_field_is_refused(
        kube: ControlPlane, namespace: str, shipped: list[Obj]) -> None:
    cron = copy.deepcopy(one(shipped, "CronJob", "jobfence-sweeper"))
    cron["metadata"]["label"] = {"x": "y"}
    err = refused(kube, namespace, cron)
    assert "unknown field" in str(err) and "label" in str(err)


def _yaml(objects: list[Obj]) -> str:
    import yaml

    return yaml.safe_dump_all(objects)
