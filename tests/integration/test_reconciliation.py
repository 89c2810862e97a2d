"""Reconciliation on real PostgreSQL against the in-memory cluster: every branch — pod gone,
pod finished/failed/Unknown, attempts exhausted, young claims, claimers outside the
cluster, reused pod names, bounded batches — and the fail-safe: a listing that fails
part-way changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from devtools.memory_cluster import MemoryCluster
from jobfence.cluster import Pod
from jobfence.errors import ClusterError
from jobfence.passes import reconciliation
from jobfence.passes.harness import Deps
from jobfence.settings import Settings
from jobfence.store import Store
from tests.support.factories import enqueue_one

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

LATER = timedelta(hours=1)


def settings(dsn: str, **kw: object) -> Settings:
    return Settings(database_url=dsn, retry_base_seconds=0, **kw)


def claim_by(store: Store, pod: str, **kw: object) -> tuple[UUID, UUID]:
    job_id = enqueue_one(store, **kw)
    [c] = store.attempts.claim(worker_id=pod, lease_seconds=600)
    assert c.job_id == job_id
    return job_id, c.attempt_id


def run(store: Store, dsn: str, cluster: MemoryCluster, now: datetime | None = None,
        **kw: object) -> reconciliation.Report:
    deps = Deps(store, settings(dsn, **kw), cluster_port=cluster,
                now=now or datetime.now(UTC) + LATER)
    return reconciliation.run_once(deps.settings, deps)


def pod(name: str, phase: str = "Running", started: datetime | None = None) -> Pod:
    at = started or datetime.now(UTC) - timedelta(minutes=5)
    return Pod(name, phase, created_at=at, started_at=at, job_name=f"job-{name}")


def test_claim_whose_pod_is_gone_is_retried_and_its_fence_rotated(
        store: Store, dsn: str) -> None:
    job_id, attempt = claim_by(store, "worker-a")
    report = run(store, dsn, MemoryCluster([pod("worker-b")]))
    assert (report.missing_pods_detected, report.retried, report.failed) == (1, 1, 0)
    row = store.jobs.get(job_id)
    assert row is not None and row.status == "pending" and row.attempt_id is None
    assert row.reason == "worker pod worker-a disappeared"
    # The dead attempt's writes now match nothing.
    assert store.attempts.heartbeat(job_id=job_id, attempt_id=attempt, lease_seconds=60) is None
    assert store.attempts.finish(job_id=job_id, attempt_id=attempt, succeeded=True) is None


@pytest.mark.parametrize("phase", ["Failed", "Unknown", "Succeeded"])
def test_claim_whose_pod_is_dead_is_status_drift(store: Store, dsn: str,
                                                 phase: str) -> None:
    job_id, _ = claim_by(store, "worker-a")
    report = run(store, dsn, MemoryCluster([pod("worker-a", phase)]))
    assert (report.status_drift_detected, report.missing_pods_detected) == (1, 0)
    row = store.jobs.get(job_id)
    assert row is not None and row.status == "pending"
    assert row.reason == f"worker pod worker-a is {phase}"


def test_a_pod_that_ended_badly_gives_its_reason_to_the_failed_attempt(
        store: Store, dsn: str) -> None:
    """A worker container OOMKilled: the attempt's error and the job's last reason say so,
    then the retry policy runs out as for any failure."""
    job_id, _ = claim_by(store, "worker-a", max_attempts=1)
    at = datetime.now(UTC) - timedelta(minutes=5)
    oom = Pod("worker-a", "Failed", created_at=at, started_at=at, job_name="job-worker-a",
              reason="jobfence: OOMKilled, exit 137")
    report = run(store, dsn, MemoryCluster([oom]))
    assert (report.status_drift_detected, report.failed) == (1, 1)
    row = store.jobs.get(job_id)
    assert row is not None and row.status == "failed"
    assert row.error == "worker pod worker-a is Failed (jobfence: OOMKilled, exit 137)"


@pytest.mark.parametrize("phase", ["Running", "Pending"])
def test_claim_whose_pod_is_alive_is_left_alone(store: Store, dsn: str,
                                                phase: str) -> None:
    job_id, attempt = claim_by(store, "worker-a")
    report = run(store, dsn, MemoryCluster([pod("worker-a", phase)]))
    assert report.missing_pods_detected == report.status_drift_detected == 0
    row = store.jobs.get(job_id)
    assert row is not None and row.status == "running" and row.attempt_id == attempt


def test_exhausted_attempts_fail_with_pod_disappeared(store: Store, dsn: str) -> None:
    job_id, _ = claim_by(store, "worker-a", max_attempts=1)
    report = run(store, dsn, MemoryCluster([]))
    assert (report.failed, report.retried) == (1, 0)
    row = store.jobs.get(job_id)
    assert row is not None and row.status == "failed"
    assert row.error == "worker pod worker-a disappeared"


def test_claims_younger_than_the_grace_period_are_not_judged(store: Store,
                                                             dsn: str) -> None:
    job_id, _ = claim_by(store, "worker-a")
    report = run(store, dsn, MemoryCluster([]), now=datetime.now(UTC),
                 reconcile_grace_seconds=60)
    assert report.missing_pods_detected == 0
    assert store.jobs.get(job_id).status == "running"


def test_claims_by_workers_outside_the_cluster_are_counted_not_judged(
        store: Store, dsn: str) -> None:
    job_id, _ = claim_by(store, "laptop.local:4242")
    report = run(store, dsn, MemoryCluster([]))
    assert report.unverifiable_claims == 1 and report.missing_pods_detected == 0
    assert store.jobs.get(job_id).status == "running"


def test_a_pod_started_after_the_claim_is_someone_else(store: Store, dsn: str) -> None:
    job_id, _ = claim_by(store, "worker-a")
    reborn = pod("worker-a", started=datetime.now(UTC) + timedelta(minutes=1))
    report = run(store, dsn, MemoryCluster([reborn]))
    assert report.missing_pods_detected == 1
    assert store.jobs.get(job_id).status == "pending"


def test_listing_that_fails_part_way_changes_nothing(store: Store, dsn: str) -> None:
    dead = [claim_by(store, f"gone-{i}")[0] for i in range(3)]
    cluster = MemoryCluster([pod(f"alive-{i}") for i in range(5)], page_size=2)
    cluster.fail_listing_at_page = 2
    with pytest.raises(ClusterError):
        run(store, dsn, cluster)
    assert [store.jobs.get(j).status for j in dead] == ["running"] * 3


def test_many_dead_claims_are_reclaimed_in_bounded_batches(store: Store,
                                                            dsn: str) -> None:
    dead = [claim_by(store, f"gone-{i}")[0] for i in range(7)]
    cluster = MemoryCluster([pod(f"alive-{i}") for i in range(5)], page_size=2)
    report = run(store, dsn, cluster, batch_size=3)
    assert report.missing_pods_detected == 7
    assert (report.pods_listed, report.pages) == (5, 3)
    assert {store.jobs.get(j).status for j in dead} == {"pending"}
    again = run(store, dsn, cluster, batch_size=3)  # idempotent: nothing left to do
    assert again.missing_pods_detected == again.status_drift_detected == 0


def test_a_dependent_of_a_job_failed_by_reconciliation_fails_too(store: Store,
                                                                 dsn: str) -> None:
    job_id, _ = claim_by(store, "worker-a", max_attempts=1)
    dependent = enqueue_one(store, after=(job_id,))
    run(store, dsn, MemoryCluster([]))
    row = store.jobs.get(dependent)
    assert row is not None and row.status == "failed"
    assert row.error == f"dependency {job_id} failed"


def test_without_a_cluster_nothing_is_compared(store: Store, dsn: str) -> None:
    job_id, _ = claim_by(store, "worker-a")
    s = settings(dsn)
    deps = Deps(store, s, now=datetime.now(UTC) + LATER)
    report = reconciliation.run_once(s, deps)
    assert report.cluster == "none" and report.pods_listed == 0
    assert store.jobs.get(job_id).status == "running"


def test_a_parent_whose_last_datum_reconciliation_fails_is_finalized_in_the_pass(
        store: Store, dsn: str) -> None:
    """The zombie last datum: its pod is gone, its attempts are spent — the pass fails it and
    finalizes its parent (failed, naming it), not a minute later."""
    from tests.support.factories import make_parent

    parent, [kid] = make_parent(store, 1, max_attempts=1)
    [c] = store.attempts.claim(worker_id="worker-a", lease_seconds=600)
    assert c.job_id == kid
    report = run(store, dsn, MemoryCluster([pod("worker-b")]))
    assert (report.failed, report.parents_finalized) == (1, 1)
    row = store.jobs.get(parent)
    assert row is not None and row.status == "failed"
    assert row.error is not None and str(kid) in row.error
