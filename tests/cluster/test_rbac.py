"""The ServiceAccounts' RBAC judged by the real authorizer, not read from YAML.

Each function that talks to the API server runs in its pod, under its own ServiceAccount
(its token mounted where the official client's in-cluster configuration reads it), through
a full pass with something to do — a claim whose pod is gone, a pod nothing claims — and
gets no 403. And each ServiceAccount is refused what its function never does, asked both
as ``kubectl auth can-i`` and as real calls with its own token: a worker's cannot list or
delete pods, reconciliation's cannot delete anything, orphan-cleanup's cannot create or
change, no ServiceAccount reaches another namespace or a Secret."""

from __future__ import annotations

import pytest

from devtools.cluster.rest import ApiError
from jobfence.adapters.kube import KubernetesCluster
from jobfence.errors import ClusterError
from tests.support.kube import (
    WORKER_LABELS,
    ControlPlane,
    Installation,
    as_account,
    can_i,
    claim_as,
    delete_namespace,
    install,
    new_namespace,
    remote_pod,
    suspended_job,
    token,
)

WORKER, RECONCILIATION, ORPHANS = "jobfence", "jobfence-reconciliation", "jobfence-orphan-cleanup"


@pytest.fixture
def inst(kube: ControlPlane, namespace: str, dsn: str) -> Installation:
    return install(kube, namespace, dsn)


@pytest.fixture
def elsewhere(kube: ControlPlane) -> str:
    name = new_namespace(kube, "elsewhere")
    yield name  # type: ignore[misc]
    delete_namespace(kube, name)


def test_each_function_does_a_full_pass_under_its_own_account_without_a_403(
        kube: ControlPlane, inst: Installation) -> None:
    labels = {**WORKER_LABELS, "jobfence.io/installation": inst.installation}
    gone = claim_as(inst.dsn, "worker-gone-1")  # its pod disappeared
    with kube.admin() as api:
        held = suspended_job(api, inst.namespace, "worker-busy")
        remote_pod(api, inst.namespace, "worker-busy-1", labels=labels, owner=held)
        claim_as(inst.dsn, "worker-busy-1")  # a claim whose pod runs: left alone
        idle = suspended_job(api, inst.namespace, "worker-idle")
        remote_pod(api, inst.namespace, "worker-idle-1", labels=labels, owner=idle)

    rec = inst.run_from_cronjob("reconciliation", "reconcile-now")
    inst.wait_job(rec)
    report = inst.summary(rec)
    assert (report["pods_listed"], report["missing_pods_detected"], report["retried"]) == (2, 1, 1)
    [row] = inst.sql("SELECT status, attempt_count FROM jobs WHERE job_id = %s", gone)
    assert row["status"] == "pending"

    clean = inst.run_from_cronjob("orphan-cleanup", "clean-now")
    inst.wait_job(clean)
    report = inst.summary(clean)
    assert (report["orphaned_pods_detected"], report["orphaned_pods_cleaned"],
            report["orphaned_pods_cleanup_failures"]) == (1, 1, 0)
    deletes = [(e["objectRef"]["resource"], e["objectRef"]["name"], e["user"]["username"],
                e.get("requestObject"), e["responseStatus"]["code"]) for e in kube.audit()
               if e["objectRef"].get("namespace") == inst.namespace]
    with kube.admin() as api:
        assert not api.exists(f"/apis/batch/v1/namespaces/{inst.namespace}/jobs/worker-idle"), \
            (deletes, inst.logs_of_job(clean))
        assert api.exists(f"/apis/batch/v1/namespaces/{inst.namespace}/jobs/worker-busy")
    for job in (rec, clean):
        log = inst.logs_of_job(job)
        assert "403" not in log and "Forbidden" not in log, log


MAY = {
    WORKER: set(),
    RECONCILIATION: {("list", "pods")},
    ORPHANS: {("list", "pods"), ("delete", "pods"), ("delete", "jobs.batch")},
}
ASKED = [(verb, resource) for verb in ("get", "list", "watch", "create", "patch", "delete")
         for resource in ("pods", "jobs.batch", "cronjobs.batch", "secrets", "configmaps")]


def test_each_account_may_do_exactly_what_its_function_does(
        kube: ControlPlane, inst: Installation, elsewhere: str) -> None:
    for account, may in MAY.items():
        granted = {(v, r) for v, r in ASKED if can_i(kube, inst.namespace, account, v, r)}
        assert granted == may, account
        for verb, resource in [*may, ("get", "secrets")]:
            assert not can_i(kube, inst.namespace, account, verb, resource, where=elsewhere)


def test_real_calls_with_each_token_are_judged_the_same(
        kube: ControlPlane, inst: Installation, elsewhere: str) -> None:
    ns = inst.namespace
    with kube.admin() as api:
        remote_pod(api, ns, "bystander", labels={"app": "x"})
        remote_pod(api, elsewhere, "neighbour", labels={"app": "x"})
    calls = {
        "list pods": lambda api: api.get(f"/api/v1/namespaces/{ns}/pods"),
        "delete pod": lambda api: api.delete(f"/api/v1/namespaces/{ns}/pods/bystander",
                                             dryRun="All"),
        "delete job": lambda api: api.delete(f"/apis/batch/v1/namespaces/{ns}/jobs/none"),
        "read secret": lambda api: api.get(
            f"/api/v1/namespaces/{ns}/secrets/jobfence-database-worker"),
        "list pods elsewhere": lambda api: api.get(f"/api/v1/namespaces/{elsewhere}/pods"),
        "delete pod elsewhere": lambda api: api.delete(
            f"/api/v1/namespaces/{elsewhere}/pods/neighbour", dryRun="All"),
    }
    allowed = {WORKER: set(), RECONCILIATION: {"list pods"},
               ORPHANS: {"list pods", "delete pod", "delete job"}}
    for account, expected in allowed.items():
        with as_account(kube, ns, account) as api:
            for what, call in calls.items():
                try:
                    call(api)
                    outcome = "allowed"
                except ApiError as exc:
                    # 404: authorized, and nothing there (the Job "none").
                    outcome = "allowed" if exc.status == 404 else f"HTTP {exc.status}"
                assert (outcome == "allowed") == (what in expected), (account, what, outcome)
                if what not in expected:
                    assert outcome == "HTTP 403", (account, what, outcome)


def test_the_adapter_with_a_worker_token_gets_a_cluster_error_not_a_listing(
        kube: ControlPlane, inst: Installation) -> None:
    """A listing the authorizer refuses is a ClusterError (and the pass changes nothing)."""
    adapter = KubernetesCluster(
        namespace=inst.namespace, selector="app.kubernetes.io/component=worker",
        installation=inst.installation,
        cfg=kube.client_configuration(token=token(kube, inst.namespace, WORKER)))
    with pytest.raises(ClusterError, match="403"):
        list(adapter.worker_pod_pages())
