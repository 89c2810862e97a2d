"""The console (``jobfence serve``, JOBFENCE_AUTH=tokenreview) against the real API server,
as the shipped console component's ServiceAccount — its Role and its binding to
``system:auth-delegator``, nothing else:

* callers are whoever their real ServiceAccount token says: a reader sees, an operator (by
  user name) acts, a junk token or the token of a ServiceAccount deleted since is refused;
  a live console does not ask the API server again for every request;
* "run now" creates a Job from the function's CronJob, which the Job controller and the
  node agent run to completion, recorded as a manual run by whom and why; a CronJob that
  is not there is a 502, recorded, and holds no slot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.kube import ControlPlane, Installation, install, token, wait_for
from tests.support.serving import Served, serve

OPERATOR, READER = "oncall", "viewer"


@pytest.fixture
def inst(kube: ControlPlane, namespace: str, dsn: str) -> Installation:
    installed = install(kube, namespace, dsn, components=("console",))
    with kube.admin() as api:
        for account in (OPERATOR, READER):
            api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                     {"apiVersion": "v1", "kind": "ServiceAccount",
                      "metadata": {"name": account}})
    return installed


@pytest.fixture
def console(kube: ControlPlane, inst: Installation, tmp_path: Path) -> Iterator[Served]:
    """jobfence serve as the console component's pod runs it: its own ServiceAccount."""
    creds = kube.credentials()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "console",
        "clusters": [{"name": "c", "cluster": {"server": creds.server,
                                                "certificate-authority": creds.ca_file}}],
        "users": [{"name": "console", "user": {
            "token": token(kube, inst.namespace, "jobfence-console")}}],
        "contexts": [{"name": "console", "context": {"cluster": "c", "user": "console"}}]}))
    env = {"JOBFENCE_AUTH": "tokenreview", "JOBFENCE_CLUSTER": "kubernetes",
           "JOBFENCE_NAMESPACE": inst.namespace, "KUBECONFIG": str(kubeconfig),
           "JOBFENCE_INSTALLATION": inst.installation,
           "JOBFENCE_AUTH_OPERATORS": f"system:serviceaccount:{inst.namespace}:{OPERATOR}"}
    with serve(inst.dsn, **env) as served:
        yield served


def bearer(kube: ControlPlane, inst: Installation, account: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(kube, inst.namespace, account)}"}


def reviews(kube: ControlPlane, inst: Installation) -> int:
    user = f"system:serviceaccount:{inst.namespace}:jobfence-console"
    return sum(1 for e in kube.audit() if e["objectRef"]["resource"] == "tokenreviews"
               and e["user"]["username"] == user)


def test_real_tokens_a_reader_sees_an_operator_acts_a_junk_token_is_refused(
        kube: ControlPlane, inst: Installation, console: Served) -> None:
    reader, operator = bearer(kube, inst, READER), bearer(kube, inst, OPERATOR)
    assert console.get("/api/v1/jobs").status == 401
    assert console.get("/api/v1/jobs", headers={"Authorization": "Bearer junk"}).status == 401
    me = console.get("/api/v1/me", headers=reader)
    assert me.status == 200 and me.body["may_operate"] is False
    assert me.body["user"] == f"system:serviceaccount:{inst.namespace}:{READER}"
    assert console.get("/api/v1/queues", headers=reader).status == 200
    assert console.post("/api/v1/drain", {"on": True}, headers=reader).status == 403
    assert console.post("/api/v1/drain", {"on": True}, headers=operator).body["draining"]
    asked = reviews(kube, inst)
    for _ in range(5):  # remembered for a while: a live console does not flood the server
        assert console.get("/api/v1/queues", headers=operator).status == 200
    assert reviews(kube, inst) == asked
    # A ServiceAccount deleted since: its token is no longer valid.
    gone = bearer(kube, inst, "viewer")
    with kube.admin() as api:
        api.delete(f"/api/v1/namespaces/{inst.namespace}/serviceaccounts/{READER}")
    assert console.get("/api/v1/jobs", headers=gone).status == 401


def test_run_now_makes_a_job_from_the_cronjob_that_runs_and_is_recorded(
        kube: ControlPlane, inst: Installation, console: Served) -> None:
    operator = bearer(kube, inst, OPERATOR)
    who = f"system:serviceaccount:{inst.namespace}:{OPERATOR}"
    with kube.admin() as api:
        cron = api.get(f"/apis/batch/v1/namespaces/{inst.namespace}/cronjobs/jobfence-sweeper")
        api.delete(f"/apis/batch/v1/namespaces/{inst.namespace}/cronjobs/jobfence-sweeper")
    missing = console.post("/api/v1/functions/sweeper/trigger", {"reason": "try"},
                           headers=operator)
    assert missing.status == 502 and "jobfence-sweeper" in missing.body["error"]
    with kube.admin() as api:
        meta = {k: cron["metadata"][k] for k in ("name", "labels")}
        api.post(f"/apis/batch/v1/namespaces/{inst.namespace}/cronjobs",
                 {**cron, "metadata": meta, "status": {}})
    made = console.post("/api/v1/functions/sweeper/trigger", {"reason": "INC-7 leases"},
                        headers=operator)
    assert made.status == 202, made.body  # the refused one did not hold the slot
    name = made.body["job_name"]
    job = inst.wait_job(name)
    assert job["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
    assert job["metadata"]["annotations"]["jobfence.io/triggered-by"] == who
    runs = wait_for(lambda: inst.sql("SELECT function, trigger, triggered_by, trigger_reason, "
                                     "status FROM function_runs WHERE function = 'sweeper'"),
                    what="the sweeper's run recorded")
    assert [(r["trigger"], r["triggered_by"], r["status"]) for r in runs] == [
        ("manual", who, "succeeded")]
    assert "INC-7 leases" in runs[0]["trigger_reason"]
    rows = inst.sql("SELECT outcome, error IS NOT NULL AS e FROM function_triggers "
                    "ORDER BY trigger_id")
    assert [(r["outcome"], r["e"]) for r in rows] == [("failed", True), ("created", False)]
