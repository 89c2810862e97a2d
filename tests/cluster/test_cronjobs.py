"""Every CronJob the base ships, run by hand as an operator would
(``kubectl create job --from=cronjob/<name>``) on the real control plane: the Job reaches
Complete, its pod Succeeded — as uid 10001 on a read-only root, under the restricted Pod
Security level, reaching PostgreSQL as its role's login — and the run is recorded as manual.
The enqueue template enqueues its ConfigMap's spec."""

from __future__ import annotations

import json

import pytest

from tests.support.kube import ControlPlane, Installation, install
from tests.support.manifests import PERIODIC


@pytest.fixture
def inst(kube: ControlPlane, namespace: str, dsn: str) -> Installation:
    return install(kube, namespace, dsn)


def test_every_periodic_function_run_by_hand_completes_and_is_recorded_as_manual(
        inst: Installation) -> None:
    jobs = {function: inst.run_from_cronjob(function, f"{function}-now")
            for function in PERIODIC}
    for function, job in jobs.items():
        done = inst.wait_job(job)
        assert done["status"]["succeeded"] == 1, function
        pods = inst.pods_of_job(job)
        assert len(pods) == 1, (function, [inst.pod_story(p) for p in pods])
        [pod] = pods
        assert pod["status"]["phase"] == "Succeeded", function
        [container] = pod["status"]["containerStatuses"]
        assert container["state"]["terminated"]["exitCode"] == 0, function
        assert inst.summary(job)["function"] == function
    runs = inst.sql("SELECT function, trigger, status FROM function_runs ORDER BY run_id")
    by_hand = {r["function"]: r for r in runs if r["trigger"] == "manual"}
    assert set(by_hand) == set(PERIODIC), runs
    assert {r["status"] for r in by_hand.values()} == {"succeeded"}


def test_the_enqueue_template_enqueues_its_spec(inst: Installation) -> None:
    job = inst.run_from_cronjob("enqueue", "enqueue-now")
    inst.wait_job(job)
    [line] = [x for x in inst.logs_of_job(job).splitlines() if x.startswith("{\"job_id\"")]
    job_id = json.loads(line)["job_id"]
    [row] = inst.sql("SELECT status, actions FROM jobs WHERE job_id = %s", job_id)
    assert row["status"] == "pending"
    assert row["actions"][0]["name"] == "sleep"
