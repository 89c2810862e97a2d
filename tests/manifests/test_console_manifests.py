"""The optional console (manifests/components/console): `jobfence serve` rendered into an
overlay beside the base, valid against the Kubernetes schemas, serving as the operator role
behind a Service and a disruption budget, probed on /readyz and /healthz, as restricted as
every pod of the base (test_policies' checks, applied to its pod), and with exactly the
Kubernetes permissions a manual trigger and a TokenReview need. Its `proxy` component
switches to an authenticating proxy's headers and lets only the proxy reach the pods."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path

import kubernetes_validate
import pytest

from tests.support.manifests import (
    KUBERNETES_VERSION,
    MANIFESTS,
    POLICIES,
    Obj,
    Rule,
    api_rules,
    granted,
    of_kind,
    one,
    pod_templates,
    port_calls,
    render,
)

NAME = "jobfence-console"
COMPONENT = {"app.kubernetes.io/component": "console"}
SECRET_OF_OPERATOR = {"name": "jobfence-database-operator", "key": "url"}

# What the console asks of the Kubernetes API, stated here (the adapter's
# KubernetesCluster.trigger): a manual trigger reads the function's CronJob and creates a
# Job from its template. Nothing else in the namespace; TokenReview through the
# ClusterRoleBinding to system:auth-delegator.
CONSOLE_RULES: set[Rule] = {("batch", "cronjobs", "get"), ("batch", "jobs", "create")}
AUTH_DELEGATOR = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                  "name": "system:auth-delegator"}
OBJECTS = {("ServiceAccount", NAME), ("Role", NAME), ("RoleBinding", NAME),
           ("ClusterRoleBinding", "jobfence-console-auth-delegator"), ("Deployment", NAME),
           ("Service", NAME), ("PodDisruptionBudget", NAME)}


def render_overlay(root: Path, *components: str) -> list[Obj]:
    rel = Path(os.path.relpath(MANIFESTS, root))
    listed = "".join(f"  - {rel / 'components' / c}\n" for c in components)
    (root / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"namespace: jobfence\nresources:\n  - {rel}\n"
        f"components:\n{listed}"
        "images:\n  - name: jobfence\n    newTag: test\n")
    return render(root)


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render_overlay(tmp_path_factory.mktemp("overlay"), "console")


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render_overlay(tmp_path_factory.mktemp("proxied"), "console", "console/proxy")


def console_objects(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects
            if o["metadata"].get("labels", {}).items() >= COMPONENT.items()]


def pod(objects: list[Obj]) -> Obj:
    return dict(one(objects, "Deployment", NAME)["spec"]["template"])


def container(objects: list[Obj]) -> Obj:
    [c] = pod(objects)["spec"]["containers"]
    return dict(c)


def env(objects: list[Obj]) -> dict[str, Obj]:
    return {e["name"]: e for e in container(objects)["env"]}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and labels.items() >= selector.items()


# -- rendered and valid -------------------------------------------------------------------

def test_the_console_renders_valid_beside_the_base(overlay: list[Obj]) -> None:
    objects = console_objects(overlay)
    assert {(o["kind"], o["metadata"]["name"]) for o in objects} == OBJECTS
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        if obj["kind"] != "ClusterRoleBinding":
            assert obj["metadata"]["namespace"] == "jobfence", obj["kind"]
    assert container(overlay)["image"] == "jobfence:test"  # the overlay's image, retagged


def test_its_selectors_the_service_and_the_budget_reach_the_console_pods_only(
        overlay: list[Obj]) -> None:
    deployment = one(overlay, "Deployment", NAME)
    labels = pod(overlay)["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 2
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    service = one(overlay, "Service", NAME)
    assert service["spec"]["type"] == "ClusterIP"
    assert selects(service["spec"]["selector"], labels)
    [port] = service["spec"]["ports"]
    [http] = container(overlay)["ports"]
    assert (port["port"], port["targetPort"]) == (80, "http")
    assert http == {"name": "http", "containerPort": 8080}
    budget = one(overlay, "PodDisruptionBudget", NAME)["spec"]
    assert selects(budget["selector"]["matchLabels"], labels)
    assert budget.get("maxUnavailable") == 1 or budget.get("minAvailable") == 1
    # No other pod of the installation is behind the Service, the budget or the Deployment.
    for where, template in pod_templates(overlay):
        other = template["metadata"]["labels"]
        for selector in (service["spec"]["selector"], budget["selector"]["matchLabels"],
                         deployment["spec"]["selector"]["matchLabels"]):
            assert not selects(selector, other), where
    spread = pod(overlay)["spec"].get("topologySpreadConstraints", [])
    assert all(selects(s["labelSelector"]["matchLabels"], labels) for s in spread)


def test_it_serves_as_the_operator_with_tokenreview_and_nobody_may_act(
        overlay: list[Obj]) -> None:
    c, spec = container(overlay), pod(overlay)["spec"]
    assert c["args"] == ["serve", "--host", "0.0.0.0", "--port", "8080"]
    assert "command" not in c  # the image's ENTRYPOINT is `jobfence`
    variables = env(overlay)
    assert variables["JOBFENCE_DATABASE_URL"] == {
        "name": "JOBFENCE_DATABASE_URL", "valueFrom": {"secretKeyRef": SECRET_OF_OPERATOR}}
    assert variables["JOBFENCE_READER_DATABASE_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "jobfence-database-reader", "key": "url"}}
    assert variables["JOBFENCE_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}
    assert {"configMapRef": {"name": "jobfence-config"}} in c["envFrom"]
    plain = {name: e.get("value") for name, e in variables.items() if "valueFrom" not in e}
    assert plain == {"JOBFENCE_CLUSTER": "kubernetes", "JOBFENCE_AUTH": "tokenreview",
                     "JOBFENCE_AUTH_OPERATORS": "", "JOBFENCE_AUTH_READERS": "*"}
    assert spec["serviceAccountName"] == NAME
    assert spec["automountServiceAccountToken"] is True  # TokenReview, and creating Jobs
    assert spec["enableServiceLinks"] is False


def test_readiness_asks_the_database_and_liveness_never_does(overlay: list[Obj]) -> None:
    c = container(overlay)
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    if "startupProbe" in c:
        assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


# -- as restricted as every pod of the base -----------------------------------------------

def with_console_as_a_pod_of_the_base(objects: list[Obj]) -> list[Obj]:
    """The overlay as test_policies sees a base: the Deployment's pod template in the shape
    `pod_templates` walks (a Job's), so that its checks of every pod apply to the console
    unchanged; the one cluster-scoped binding left out (checked on its own below)."""
    deployment = one(objects, "Deployment", NAME)
    as_job = {"kind": "Job", "metadata": deployment["metadata"],
              "spec": {"template": deployment["spec"]["template"]}}
    return [o for o in objects if o["kind"] != "ClusterRoleBinding"] + [as_job]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda f: f.__name__)
def test_the_console_pod_meets_every_policy_of_the_base(
        overlay: list[Obj], policy: Callable[[list[Obj]], None]) -> None:
    objects = with_console_as_a_pod_of_the_base(overlay)
    assert f"Job/{NAME}" in {where for where, _ in pod_templates(objects)}
    policy(objects)


# -- RBAC -----------------------------------------------------------------------------------

def test_its_account_grants_exactly_a_manual_trigger_and_token_reviews(
        overlay: list[Obj]) -> None:
    namespaced = [o for o in overlay if o["kind"] != "ClusterRoleBinding"]
    assert granted(namespaced, NAME) == CONSOLE_RULES
    assert one(overlay, "ServiceAccount", NAME)["automountServiceAccountToken"] is False
    assert not of_kind(overlay, "ClusterRole")
    [binding] = of_kind(overlay, "ClusterRoleBinding")
    assert binding["metadata"]["name"] == "jobfence-console-auth-delegator"
    assert binding["roleRef"] == AUTH_DELEGATOR
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME,
                                    "namespace": "jobfence"}]


def test_the_stated_rules_are_what_the_consoles_code_calls() -> None:
    """The rules above against the code: the cluster port's methods the console calls, and
    the API calls the Kubernetes adapter makes in them (as test_rbac reads them)."""
    import jobfence.console
    import jobfence.functions.serve
    from jobfence.adapters.kube import KubernetesCluster

    sources = [inspect.getsource(jobfence.functions.serve)]
    sources += [p.read_text() for p in
                sorted(Path(inspect.getfile(jobfence.console)).parent.glob("*.py"))]
    called = set().union(*(port_calls(s) for s in sources))
    assert "trigger" in called
    rules = {(group, resource.replace("_", ""), verb)
             for method in called for group, resource, verb in api_rules(method)}
    assert rules == CONSOLE_RULES
    # A caller's token is reviewed cluster-wide: what system:auth-delegator grants.
    assert "create_token_review(" in inspect.getsource(KubernetesCluster.review_token)


# -- behind an authenticating proxy ----------------------------------------------------------

def test_behind_a_proxy_only_the_proxy_reaches_the_pods(proxied: list[Obj]) -> None:
    objects = console_objects(proxied)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    assert env(proxied)["JOBFENCE_AUTH"] == {"name": "JOBFENCE_AUTH", "value": "proxy"}
    # No token to review: no cluster-wide binding. A manual trigger still creates Jobs.
    assert not of_kind(proxied, "ClusterRoleBinding")
    assert granted(proxied, NAME) == CONSOLE_RULES
    assert pod(proxied)["spec"]["automountServiceAccountToken"] is True
    policy = one(proxied, "NetworkPolicy", NAME)["spec"]
    assert selects(policy["podSelector"]["matchLabels"], pod(proxied)["metadata"]["labels"])
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert rule["from"]
    for peer in rule["from"]:  # a chosen set of pods, never "everyone" or an address block
        assert "ipBlock" not in peer
        assert peer["podSelector"]["matchLabels"], peer
        assert peer["namespaceSelector"]["matchLabels"], peer
    # Everything else as without the proxy.
    assert {(o["kind"], o["metadata"]["name"]) for o in objects} == (
        OBJECTS - {("ClusterRoleBinding", "jobfence-console-auth-delegator")}
        | {("NetworkPolicy", NAME)})
