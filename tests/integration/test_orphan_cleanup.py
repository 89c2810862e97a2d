"""orphan-cleanup on real PostgreSQL with the in-memory cluster and object store: unclaimed
worker pods are deleted (through their Jobs) only after passes spanning the grace period,
never while they hold a claim; finished pods beyond the history are deleted, newest kept;
S3 objects of losing, failed and cancelled attempts and of deleted jobs go, while live
claims' and committed outputs and manifests stay; failures are counted and the pass goes
on; a failed listing changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from devtools.memory_cluster import MemoryCluster
from devtools.memory_objects import MemoryObjectStore
from jobfence.cluster import Pod
from jobfence.errors import ClusterError
from jobfence.objectstore import attempt_prefix, manifest_key
from jobfence.passes import orphan_cleanup
from jobfence.passes.harness import Deps
from jobfence.passes.orphan_cleanup import owner_of
from jobfence.settings import Settings
from jobfence.store import IMMEDIATE, Store
from tests.support.factories import enqueue_one

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

BUCKET = "out"
GRACE = 600.0


def settings(dsn: str, **kw: object) -> Settings:
    kw.setdefault("orphan_pod_grace_seconds", GRACE)
    kw.setdefault("reconcile_grace_seconds", 0)
    return Settings(database_url=dsn, **kw)  # type: ignore[arg-type]


def run(store: Store, s: Settings, *, cluster: MemoryCluster | None = None,
        objects: MemoryObjectStore | None = None,
        at: timedelta = timedelta(0)) -> orphan_cleanup.Report:
    deps = Deps(store, s, cluster_port=cluster, object_store=objects,
                now=datetime.now(UTC) + at)
    return orphan_cleanup.run_once(s, deps)


def pod(name: str, phase: str = "Running", age: timedelta = timedelta(hours=1),
        uid: str | None = None) -> Pod:
    at = datetime.now(UTC) - age
    return Pod(name, phase, created_at=at, started_at=at, job_name=f"job-{name}",
               uid=uid or f"uid-{name}", job_uid=f"job-uid-{name}")


def cluster_of(*pods: Pod) -> MemoryCluster:
    c = MemoryCluster(page_size=2)
    for p in pods:
        c.add(p)
    return c


# -- pods ------------------------------------------------------------------------------


def test_unclaimed_pod_is_deleted_with_its_job_only_after_the_grace_period(
        store: Store, dsn: str) -> None:
    s = settings(dsn)
    cluster = cluster_of(pod("idle"), pod("busy"))
    enqueue_one(store)
    store.attempts.claim(worker_id="busy", lease_seconds=600)
    first = run(store, s, cluster=cluster)
    assert (first.orphan_suspects, first.orphaned_pods_detected) == (1, 0)
    assert cluster.deleted_jobs == []
    second = run(store, s, cluster=cluster, at=timedelta(seconds=GRACE + 1))
    assert (second.orphaned_pods_detected, second.orphaned_pods_cleaned) == (1, 1)
    assert cluster.deleted_jobs == ["job-idle"]  # the Job, so no new pod replaces it
    assert "busy" in cluster.pods


def test_a_pod_that_took_a_suspects_name_starts_its_own_grace_period(
        store: Store, dsn: str) -> None:
    """The pod seen unclaimed was replaced by another under its name (another uid): the
    grace period the first one served does not count for the second."""
    s = settings(dsn)
    cluster = cluster_of(pod("reused", uid="first"))
    assert run(store, s, cluster=cluster).orphan_suspects == 1
    cluster.pods.clear()
    cluster.add(pod("reused", uid="second"))
    later = run(store, s, cluster=cluster, at=timedelta(seconds=GRACE + 1))
    assert (later.orphan_suspects, later.orphaned_pods_detected) == (1, 0)
    assert cluster.deleted_pods == [] and cluster.deleted_jobs == []
    gone = run(store, s, cluster=cluster, at=timedelta(seconds=2 * GRACE + 2))
    assert gone.orphaned_pods_cleaned == 1


def test_a_suspect_that_claims_work_is_forgotten(store: Store, dsn: str) -> None:
    s = settings(dsn)
    cluster = cluster_of(pod("slow-starter"))
    assert run(store, s, cluster=cluster).orphan_suspects == 1
    enqueue_one(store)
    store.attempts.claim(worker_id="slow-starter", lease_seconds=600)
    later = run(store, s, cluster=cluster, at=timedelta(seconds=GRACE + 1))
    assert later.orphaned_pods_detected == 0 and cluster.deleted_jobs == []
    # Its claim ended; it counts as a new suspect from now on, not from the first sighting.
    store.conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now()")
    again = run(store, s, cluster=cluster, at=timedelta(seconds=GRACE + 2))
    assert (again.orphan_suspects, again.orphaned_pods_detected) == (1, 0)


def test_confirm_refuses_a_suspect_that_claimed_after_the_listing(store: Store,
                                                                   dsn: str) -> None:
    s = settings(dsn)
    cluster = cluster_of(pod("racer"))
    run(store, s, cluster=cluster)
    enqueue_one(store)
    store.attempts.claim(worker_id="racer", lease_seconds=600)
    assert store.pods.confirm_suspect("racer") is False


def test_finished_pods_beyond_history_go_newest_kept(store: Store, dsn: str) -> None:
    s = settings(dsn, finished_pod_history=2)
    pods = [pod(f"done-{i}", "Succeeded" if i % 2 else "Failed", age=timedelta(hours=10 - i))
            for i in range(5)]
    cluster = cluster_of(*pods, pod("claimant", "Failed", age=timedelta(days=1)))
    enqueue_one(store)
    store.attempts.claim(worker_id="claimant", lease_seconds=600)  # reconciliation's business
    report = run(store, s, cluster=cluster)
    assert report.finished_pods_deleted == 3
    assert sorted(cluster.deleted_jobs) == ["job-done-0", "job-done-1", "job-done-2"]
    assert {"done-3", "done-4", "claimant"} <= set(cluster.pods)


def test_a_failed_delete_is_counted_and_the_pass_goes_on(store: Store,
                                                         dsn: str) -> None:
    s = settings(dsn, finished_pod_history=0)
    cluster = cluster_of(pod("a", "Succeeded"), pod("b", "Succeeded"))
    cluster.fail_deletes = {"job-a"}
    report = run(store, s, cluster=cluster)
    assert (report.finished_pods_deleted, report.finished_pods_cleanup_failures) == (1, 1)
    assert cluster.deleted_jobs == ["job-b"]


def test_a_failed_listing_changes_nothing(store: Store, dsn: str) -> None:
    s = settings(dsn, finished_pod_history=0)
    cluster = cluster_of(*(pod(f"p{i}", "Succeeded") for i in range(5)))
    cluster.fail_listing_at_page = 1
    with pytest.raises(ClusterError):
        run(store, s, cluster=cluster)
    assert cluster.deleted_jobs == [] and len(cluster.pods) == 5


# -- objects ---------------------------------------------------------------------------


def test_owner_of_parses_the_layout() -> None:
    j, a, mine = uuid4(), uuid4(), "jobfence/prod/"
    assert owner_of(f"jobfence/prod/{j}/{a}/out/x.csv", mine) == (j, a)
    assert owner_of(f"jobfence/prod/{j}/manifest.json", mine) == (j, None)
    assert owner_of("jobfence/prod/not-a-uuid/x", mine) is None
    assert owner_of(f"jobfence/staging/{j}/{a}/x", mine) is None  # another installation's
    assert owner_of(f"jobfence/{j}/{a}/x", mine) is None  # an earlier release's layout
    assert owner_of(f"elsewhere/{j}/{a}/x", mine) is None
    assert owner_of(f"jobfence/prod/{j}/", mine) is None


def put(objects: MemoryObjectStore, job: UUID, attempt: UUID | None, name: str,
        installation: str = "") -> str:
    installation = installation or INSTALLATION[0]
    key = (attempt_prefix(installation, job, attempt) + name) if attempt \
        else manifest_key(installation, job)
    objects.put_bytes(BUCKET, key, b"x")
    return key


INSTALLATION: list[str] = []
"""The installation of the test's database (set by the fixture below)."""


@pytest.fixture(autouse=True)
def _installation(store: Store) -> None:
    identity = store.control.identity()
    INSTALLATION[:] = [str(identity.installation)]


def test_objects_nothing_owns_go_and_owned_ones_stay(store: Store, dsn: str) -> None:
    s = settings(dsn, s3_bucket=BUCKET, orphan_object_grace_seconds=60)
    objects = MemoryObjectStore()
    # A job retried once and then succeeded: the first attempt lost, the second won.
    won = enqueue_one(store)
    [c1] = store.attempts.claim(worker_id="w", lease_seconds=600)
    store.attempts.release(job_id=won, attempt_id=c1.attempt_id, reason="flaky", retry=IMMEDIATE)
    [c2] = store.attempts.claim(worker_id="w", lease_seconds=600)
    store.attempts.finish(job_id=won, attempt_id=c2.attempt_id, succeeded=True)
    # A job running now, and a job that failed for good, and one cancelled mid-run.
    running = enqueue_one(store)
    [c3] = store.attempts.claim(worker_id="w", lease_seconds=600)
    failed = enqueue_one(store, max_attempts=1)
    [c4] = store.attempts.claim(worker_id="w", lease_seconds=600)
    store.attempts.release(job_id=failed, attempt_id=c4.attempt_id, reason="boom", retry=IMMEDIATE)
    cancelled = enqueue_one(store)
    [c5] = store.attempts.claim(worker_id="w", lease_seconds=600)
    store.jobs.cancel(job_id=cancelled)
    keep = [put(objects, won, c2.attempt_id, "part-0"), put(objects, won, None, ""),
            put(objects, running, c3.attempt_id, "part-0")]
    gone = [put(objects, won, c1.attempt_id, "part-0"), put(objects, failed, c4.attempt_id, "p"),
            put(objects, cancelled, c5.attempt_id, "p"), put(objects, uuid4(), uuid4(), "p"),
            put(objects, uuid4(), None, "")]
    objects.put_bytes(BUCKET, f"jobfence/{INSTALLATION[0]}/README", b"not a job's")
    # Another installation's garbage in the same bucket, and an earlier release's layout:
    # never listed, never judged.
    foreign = [put(objects, uuid4(), uuid4(), "p", installation="another"),
               put(objects, uuid4(), None, "", installation="another")]
    legacy = f"jobfence/{uuid4()}/{uuid4()}/p"
    objects.put_bytes(BUCKET, legacy, b"x")
    report = run(store, s, objects=objects, at=timedelta(minutes=5))
    left = {k for b, k in objects.objects if b == BUCKET}
    assert left == {*keep, f"jobfence/{INSTALLATION[0]}/README", *foreign, legacy}
    assert (report.objects_scanned, report.orphaned_objects_deleted) == (9, len(gone))
    assert report.objects_unrecognized == 1
    # Young garbage waits for the grace period.
    young = put(objects, uuid4(), uuid4(), "p")
    assert run(store, s, objects=objects).orphaned_objects_deleted == 0
    assert young in {k for _, k in objects.objects}


def test_object_delete_failures_are_counted(store: Store, dsn: str) -> None:
    s = settings(dsn, s3_bucket=BUCKET, orphan_object_grace_seconds=0)
    objects = MemoryObjectStore()
    stuck = put(objects, uuid4(), uuid4(), "p")
    put(objects, uuid4(), uuid4(), "q")
    objects.fail_deletes = {stuck}
    report = run(store, s, objects=objects, at=timedelta(minutes=1))
    assert (report.orphaned_objects_deleted, report.orphaned_objects_cleanup_failures) == (1, 1)
