"""Every ServiceAccount grants exactly the Kubernetes verbs its function's code calls.

The calls are read from the code, not listed by hand: which methods of the cluster port a
function's module calls (a pod snapshot pages through worker pods), and which API call
each method of the Kubernetes adapter makes (``core.list_namespaced_pod`` → list pods).
A function that calls none runs under a ServiceAccount bound to nothing, without a token.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from jobfence.functions.cli import COMMANDS
from jobfence.passes.harness import Deps
from tests.support.manifests import (
    Obj,
    Rule,
    api_rules,
    granted,
    of_kind,
    pod_templates,
    port_calls,
)

PASSES = Path(inspect.getfile(Deps)).parent
FUNCTIONS = PASSES.parent.parent / "functions"


def needed(command: str) -> set[Rule]:
    """What a command's code asks of the cluster: its entrypoint's, and for a periodic
    function its pass's (``jobfence.passes``)."""
    module = COMMANDS[command][0].partition(":")[0]
    source = "\n".join(p.read_text() for p in (FUNCTIONS / f"{module}.py",
                                               PASSES / f"{module}.py") if p.exists())
    return {rule for method in port_calls(source) for rule in api_rules(method)}


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
