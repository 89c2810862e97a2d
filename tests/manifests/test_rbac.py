"""Every ServiceAccount grants exactly the Kubernetes verbs its function's code calls.

The calls are read from the code, not listed by hand: which methods of the cluster port a
function's module calls (a pod snapshot pages through worker pods), and which API call
each method of the Kubernetes adapter makes (``core.list_namespaced_pod`` → list pods).
A function that calls none runs under a ServiceAccount bound to nothing, without a token.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from jobfence.adapters.kube import KubernetesCluster
from jobfence.cluster import Cluster
from jobfence.functions.cli import COMMANDS
from jobfence.passes.harness import Deps
from tests.manifests.rendered import Obj, of_kind, pod_templates

FUNCTIONS = Path(inspect.getfile(Deps)).parent.parent / "functions"
PORT = {name for name, _ in inspect.getmembers(Cluster, inspect.isfunction)
        if not name.startswith("_")}
API_CALL = re.compile(r"self\.(core|batch)\.(list|read|delete|create|patch)_namespaced_(\w+)\(")
VERB = {"read": "get"}
GROUP = {"core": "", "batch": "batch"}

Rule = tuple[str, str, str]


def api_rules(method: str) -> set[Rule]:
    """(apiGroup, resource, verb) of each API call a method of the adapter makes."""
    source = inspect.getsource(getattr(KubernetesCluster, method))
    return {(GROUP[api], f"{kind.replace('_', '')}s", VERB.get(op, op))
            for api, op, kind in API_CALL.findall(source)}


def port_calls(source: str) -> set[str]:
    called = {m for m in re.findall(r"\.(\w+)\(", source) if m in PORT}
    if ".pod_snapshot(" in source:
        called |= port_calls(inspect.getsource(Deps.pod_snapshot))
    return called


def needed(command: str) -> set[Rule]:
    module = COMMANDS[command][0].partition(":")[0]
    source = (FUNCTIONS / f"{module}.py").read_text()
    return {rule for method in port_calls(source) for rule in api_rules(method)}


def granted(base: list[Obj], account: str) -> set[Rule]:
    roles = {b["roleRef"]["name"] for b in of_kind(base, "RoleBinding")
             if any(s["kind"] == "ServiceAccount" and s["name"] == account
                    for s in b["subjects"])}
    assert not of_kind(base, "ClusterRoleBinding")
    return {(group, resource, verb)
            for r in of_kind(base, "Role") if r["metadata"]["name"] in roles
            for rule in r["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_the_adapter_calls_are_found() -> None:
    assert needed("reconciliation") == {("", "pods", "list")}
    assert needed("orphan-cleanup") == {("", "pods", "list"), ("", "pods", "delete"),
                                        ("batch", "jobs", "delete")}
    assert needed("worker") == set()


@pytest.mark.parametrize("command", ["worker", "sweeper", "reconciliation", "lifecycle",
                                     "export-finalize", "orphan-cleanup", "enqueue",
                                     "migrate"])
def test_each_service_account_grants_exactly_what_its_function_calls(
        base: list[Obj], command: str) -> None:
    templates = [(where, t) for where, t in pod_templates(base)
                 if t["spec"]["containers"][0]["args"][0] == command]
    assert templates, command
    for where, template in templates:
        spec = template["spec"]
        want = needed(command)
        assert granted(base, spec["serviceAccountName"]) == want, where
        assert spec["automountServiceAccountToken"] is bool(want), where
        accounts = {a["metadata"]["name"]: a for a in of_kind(base, "ServiceAccount")}
        assert accounts[spec["serviceAccountName"]]["automountServiceAccountToken"] is False
