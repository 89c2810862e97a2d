"""A node that goes away mid-job: its kubelet killed while a worker pod runs a command.

The node stops reporting and goes NotReady; its pod still runs (nothing is left on the node
to stop it) and its worker still holds the claim; an operator force-deletes the pod, as
for any node that will not come back. One reconciliation pass — on another node (here: a
process with the reconciliation ServiceAccount's token and its role's login) — finds the
claim's pod gone and reclaims the job: the fence rotated, the job pending again. The
stale worker's next heartbeat matches nothing, so it stops its command. When the node comes
back, its kubelet stops what was left of the deleted pod, and the job runs to its end in a
new pod, exactly once.

These tests stop the session's kubelet: ``make test`` runs them after the others, alone
(marker ``stops_node``)."""

from __future__ import annotations

import json
import subprocess

import pytest

from devtools.cluster.plane import NODE
from tests.support import JOBFENCE, REPO, cli_env
from tests.support.kube import (
    TEST_CONFIG,
    ControlPlane,
    enqueue_command,
    install,
    kubeconfig_for,
    pod_pids,
    wait_for,
)

pytestmark = pytest.mark.stops_node


def node_ready(kube: ControlPlane) -> str:
    with kube.admin() as api:
        node = api.get(f"/api/v1/nodes/{NODE}")
    return next((c["status"] for c in node["status"].get("conditions") or []
                 if c["type"] == "Ready"), "")


def test_a_node_lost_mid_job_is_reclaimed_by_one_pass_and_the_job_runs_once(
        kube: ControlPlane, namespace: str, dsn: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    inst = install(kube, namespace, dsn)
    # Long enough to outlast the node's judging (the controllers' 20 s grace, and more on a
    # machine busy with the rest of the suite): the job must still run when the node is lost.
    job_id = enqueue_command(dsn, ["sleep", "50"])
    inst.worker_job("worker-on-lost-node")
    pod = inst.claiming_pod(job_id, "worker-on-lost-node", timeout=90)
    [first] = inst.sql("SELECT claimed_by, attempt_id FROM jobs WHERE job_id = %s", job_id)
    kube.plane.stop_kubelet()
    try:
        wait_for(lambda: node_ready(kube) == "Unknown", what="the node NotReady (Unknown)",
                 timeout=90, interval=1)
        # Nothing on the node stopped the pod: its worker still holds the claim.
        assert pod_pids(kube, pod)
        [row] = inst.sql("SELECT status, attempt_id FROM jobs WHERE job_id = %s", job_id)
        assert (row["status"], row["attempt_id"]) == ("running", first["attempt_id"])
        out = kube.run("-n", namespace, "delete", "pod", pod["metadata"]["name"],
                       "--grace-period=0", "--force", "--wait=false")
        assert out.returncode == 0, out.stderr

        # One reconciliation pass, away from the lost node.
        env = cli_env(dsn, "reconciliation",
                      KUBECONFIG=str(kubeconfig_for(kube, namespace, "jobfence-reconciliation",
                                                    tmp_path / "kubeconfig")),
                      JOBFENCE_CLUSTER="kubernetes", JOBFENCE_NAMESPACE=namespace,
                      JOBFENCE_INSTALLATION=inst.installation, JOBFENCE_LOG_FORMAT="json",
                      **TEST_CONFIG)  # the installation's graces and retry policy
        rec = subprocess.run([*JOBFENCE, "reconciliation"], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=120, check=False)
        assert rec.returncode == 0, rec.stderr
        [summary] = [json.loads(x) for x in rec.stdout.splitlines() if '"function"' in x]
        assert summary["missing_pods_detected"] == 1, summary
        [row] = inst.sql("SELECT status, attempt_id, error FROM jobs WHERE job_id = %s", job_id)
        assert row["status"] == "pending", row
        assert row["attempt_id"] is None or row["attempt_id"] != first["attempt_id"]
        assert f"worker pod {first['claimed_by']} disappeared" in row["error"]
        # The stale worker, still running on the cut-off node, is refused at its next
        # heartbeat and stops its command: its pod's processes end (the lease is 30 s).
    finally:
        kube.plane.start_kubelet()
    assert node_ready(kube) == "True"
    wait_for(lambda: not kube.plane.node.pids_of_pod(pod["metadata"]["uid"]),
             what="the lost pod's processes stopped", timeout=90, interval=1)

    inst.worker_job("worker-after-loss")
    wait_for(lambda: inst.sql("SELECT status FROM jobs WHERE job_id = %s", job_id)[0][
        "status"] == "succeeded", what="the job run to its end", timeout=180, interval=1)
    [done] = inst.sql("SELECT claimed_by, attempt_count FROM jobs WHERE job_id = %s", job_id)
    assert done["claimed_by"].startswith("worker-after-loss-"), done
    finished = inst.sql("SELECT count(*) AS n FROM job_events WHERE job_id = %s "
                        "AND to_status = 'succeeded'", job_id)
    assert finished[0]["n"] == 1
