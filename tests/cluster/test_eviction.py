"""Eviction and loss of a worker pod on the real control plane, the worker pods made from
the shipped ScaledJob's template as KEDA makes them (the command sidecar beside the worker).

* A pod deleted mid-job (an eviction, a drain): the kubelet sends SIGTERM, tini passes it
  to the worker, and the worker gives its job back (pending again, its attempt not spent)
  within the grace period; the pod ends in a terminal phase and the kubelet deletes it with
  a UID precondition; the job then runs to its end in another pod.
* A pod force-deleted while its processes stopped answering (frozen, then killed by the
  kubelet): nothing gave the job back, and one reconciliation pass — in its own pod, under
  its own ServiceAccount — reclaims it.

(The kubelet itself stopped mid-job: tests/cluster/test_node_loss.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from tests.support.kube import (
    ControlPlane,
    Installation,
    LogFollower,
    enqueue_command,
    install,
    pod_pids,
    wait_for,
)

GRACE = 30  # the shipped terminationGracePeriodSeconds


def running_worker(inst: Installation, job_id: str, name: str) -> dict:  # type: ignore[type-arg]
    inst.worker_job(name)
    return inst.claiming_pod(job_id, name, timeout=90)


def test_a_worker_pod_deleted_mid_job_gives_its_job_back_within_the_grace_period(
        kube: ControlPlane, namespace: str, dsn: str) -> None:
    inst = install(kube, namespace, dsn)
    job_id = enqueue_command(dsn, ["sleep", "15"])
    pod = running_worker(inst, job_id, "worker-evicted")
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    log = LogFollower(kube, namespace, name, "jobfence")  # the kubelet removes the files
    began = time.monotonic()
    with kube.admin() as api:
        api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
    wait_for(lambda: inst.sql("SELECT status FROM jobs WHERE job_id = %s", job_id)[0][
        "status"] == "pending", what="the job given back", timeout=GRACE)
    assert time.monotonic() - began < GRACE
    [job] = inst.sql("SELECT attempt_count, interruptions FROM jobs WHERE job_id = %s", job_id)
    assert job["interruptions"] == 1
    # The pod: terminal, then deleted by the kubelet, that pod and no other.
    with kube.admin() as api:
        wait_for(lambda: not api.exists(f"/api/v1/namespaces/{namespace}/pods/{name}"),
                 what="the pod deleted", timeout=GRACE + 30)
    [final] = [e for e in kube.audit() if e["verb"] == "delete"
               and e["objectRef"].get("name") == name
               and e["user"]["username"] == "system:node:jobfence-node"]
    assert final["requestObject"]["preconditions"]["uid"] == uid
    assert final["requestObject"]["gracePeriodSeconds"] == 0
    assert "sigterm_released" in log.text(), log.text()
    # ... and runs to its end in another pod (as KEDA starts one for a pending job).
    inst.worker_job("worker-next")
    wait_for(lambda: inst.sql("SELECT status FROM jobs WHERE job_id = %s", job_id)[0][
        "status"] == "succeeded", what="the job done by the next pod", timeout=90)
    [done] = inst.sql("SELECT claimed_by, attempt_count FROM jobs WHERE job_id = %s", job_id)
    assert done["claimed_by"].startswith("worker-next-"), done


def test_a_force_deleted_pod_is_reclaimed_by_one_reconciliation_pass(
        kube: ControlPlane, namespace: str, dsn: str) -> None:
    inst = install(kube, namespace, dsn)
    job_id = enqueue_command(dsn, ["sleep", "300"])
    pod = running_worker(inst, job_id, "worker-lost")
    name = pod["metadata"]["name"]
    for pid in pod_pids(kube, pod):  # the pod stops answering
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    with kube.admin() as api:
        api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds=0)
        wait_for(lambda: not api.exists(f"/api/v1/namespaces/{namespace}/pods/{name}"),
                 what="the pod gone from the API", timeout=60)
    [row] = inst.sql("SELECT status, claimed_by FROM jobs WHERE job_id = %s", job_id)
    assert (row["status"], row["claimed_by"]) == ("running", name)  # nobody gave it back
    rec = inst.run_from_cronjob("reconciliation", "reconcile-after-loss")
    inst.wait_job(rec)
    assert inst.summary(rec)["missing_pods_detected"] == 1
    [row] = inst.sql("SELECT status, error FROM jobs WHERE job_id = %s", job_id)
    assert row["status"] == "pending"
    assert f"worker pod {name} disappeared" in row["error"]
