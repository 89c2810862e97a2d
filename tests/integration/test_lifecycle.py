"""The lifecycle pass on the real store with an injected clock (no sleeping for TTLs): run
timeouts rotate the fence and retry or fail; jobs that expire before they start are
cancelled; finished jobs past their retention lose their S3 objects first and their rows
after, in bounded batches, and keep every row while any object remains; the audit trail and
function-run records go on their own retention."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

import jobfence.passes.lifecycle as lifecycle
from devtools.memory_objects import MemoryObjectStore
from jobfence.finalize import finalize_parent
from jobfence.ids import uuid7
from jobfence.objectstore import job_prefix, legacy_job_prefix, manifest_key
from jobfence.passes import budget, retention
from jobfence.passes.harness import Deps
from jobfence.store import ActionOutcome, Store
from tests.support.factories import enqueue_one, installation, make_parent, new_job
from tests.support.lifecycle import BUCKET, HOUR, db_now, run, settings

pytestmark = pytest.mark.pooled  # directly and through PgBouncer


def count(store: Store, table: str, job_id: UUID) -> int:
    queries = {  # a fixed set: the table name is never input
        "jobs": "SELECT count(*) AS n FROM jobs WHERE job_id = %s OR parent_id = %s",
        "job_outputs": "SELECT count(*) AS n FROM job_outputs o JOIN jobs j USING (job_id) "
                       "WHERE j.job_id = %s OR j.parent_id = %s",
        "job_action_results": "SELECT count(*) AS n FROM job_action_results r "
                              "JOIN jobs j USING (job_id) WHERE j.job_id = %s OR j.parent_id = %s",
    }
    row = store.conn.execute(queries[table], (job_id, job_id)).fetchone()
    assert row is not None
    return int(row["n"])


def finish_with_outputs(store: Store, objects: MemoryObjectStore, job_id: UUID,
                        files: int = 2, ok: bool = True) -> UUID:
    """Claim the (only) ready job ``job_id``, upload outputs under its attempt prefix,
    register and confirm them, and finish it."""
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    assert claim.job_id == job_id
    urls = []
    for i in range(files):
        key = f"{job_prefix(installation(store), job_id)}{claim.attempt_id}/o{i}"
        objects.put_bytes(BUCKET, key, b"x")
        urls.append((f"o{i}", f"s3://{BUCKET}/{key}"))
    assert store.attempts.register_outputs(job_id=job_id, attempt_id=claim.attempt_id, outputs=urls)
    assert store.attempts.confirm_outputs(job_id=job_id, attempt_id=claim.attempt_id, outputs=[
        {"path": p, "status": "done", "size_bytes": 1, "error": None} for p, _ in urls])
    outcome = ActionOutcome(0, "sleep", ok, datetime.now(UTC))
    assert store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=ok,
                        outcome=outcome)
    return claim.attempt_id


def keys(objects: MemoryObjectStore, prefix: str = "") -> list[str]:
    return [o.key for o in objects.iter_objects(BUCKET, prefix)]


# -- run timeouts ----------------------------------------------------------------------------

def test_running_job_past_its_timeout_is_retried_with_its_fence_rotated(
        store: Store, dsn: str) -> None:
    job_id = enqueue_one(store, timeout_seconds=60, max_attempts=3)
    [claim] = store.attempts.claim(worker_id="w1", lease_seconds=600)
    assert claim.run_deadline_at is not None
    before = run(store, dsn, now=claim.run_deadline_at - timedelta(seconds=1))
    assert before.timed_out_retried == before.timed_out_failed == 0
    report = run(store, dsn, now=claim.run_deadline_at + timedelta(seconds=1))
    assert (report.timed_out_retried, report.timed_out_failed) == (1, 0)
    row = store.jobs.get(job_id)
    assert row is not None
    assert (row.status, row.attempt_id, row.claimed_by) == ("pending", None, None)
    assert row.attempt_count == 1 and row.error == "timed out"
    # The worker's next heartbeat matches nothing: that is how it learns to stop.
    assert store.attempts.heartbeat(job_id=job_id, attempt_id=claim.attempt_id,
                           lease_seconds=60) is None
    last = store.jobs.events(job_id)[-1]
    assert (last.from_status, last.to_status) == ("running", "pending")
    assert last.attempt_id == claim.attempt_id and "timed out" in (last.reason or "")
    # Its worker may still be running the command: the job is not run again until that
    # attempt confirms the command gone (or its lease runs out).
    assert row.stopping_until is not None
    assert store.attempts.claim(worker_id="w2", lease_seconds=600) == []
    assert store.attempts.stopped(job_id=job_id, attempt_id=claim.attempt_id)
    [again] = store.attempts.claim(worker_id="w2", lease_seconds=600)
    assert again.attempt_count == 2 and again.attempt_id != claim.attempt_id


def test_timeout_on_the_last_attempt_fails_the_job_and_its_dependents(
        store: Store, dsn: str) -> None:
    job_id = enqueue_one(store, timeout_seconds=60, max_attempts=1)
    [dependent] = store.jobs.enqueue([new_job(after=(job_id,))])
    [claim] = store.attempts.claim(worker_id="w1", lease_seconds=600)
    assert claim.run_deadline_at is not None
    report = run(store, dsn, now=claim.run_deadline_at + timedelta(seconds=1))
    assert (report.timed_out_retried, report.timed_out_failed) == (0, 1)
    assert report.dependents_failed == 1
    row = store.jobs.get(job_id)
    assert row is not None and (row.status, row.error) == ("failed", "timed out")
    assert row.finished_at is not None
    dep = store.jobs.get(dependent.job_id)
    assert dep is not None and dep.error == f"dependency {job_id} failed"


def test_a_job_without_timeout_or_not_running_never_times_out(
        store: Store, dsn: str) -> None:
    no_timeout = enqueue_one(store)
    store.attempts.claim(worker_id="w", lease_seconds=600)
    pending = enqueue_one(store, timeout_seconds=1)
    report = run(store, dsn, now=db_now(store) + timedelta(days=365))
    assert report.timed_out_retried == report.timed_out_failed == 0
    assert [store.jobs.get(j).status for j in (no_timeout, pending)] == [  # type: ignore[index]
        "running", "pending"]


def test_a_timed_out_last_child_finalizes_its_parent(store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    parent, kids = make_parent(store, 2, timeout_seconds=60, max_attempts=1)
    claims = {c.job_id: c for c in store.attempts.claim(worker_id="w", lease_seconds=600, limit=2)}
    assert store.attempts.finish(job_id=kids[0], attempt_id=claims[kids[0]].attempt_id,
                                 succeeded=True)
    deadline = claims[kids[1]].run_deadline_at
    assert deadline is not None
    report = run(store, dsn, now=deadline + timedelta(seconds=1), objects=objects)
    assert report.timed_out_failed == 1 and report.parents_finalized == 1
    row = store.jobs.get(parent)
    assert row is not None and row.status == "failed"
    assert f"{kids[1]}: failed: timed out" in row.error
    assert keys(objects) == [manifest_key(installation(store), parent)]


def test_many_timeouts_go_in_bounded_batches(store: Store, dsn: str) -> None:
    for _ in range(5):
        enqueue_one(store, timeout_seconds=60)
    store.attempts.claim(worker_id="w", lease_seconds=600, limit=5)
    report = run(store, dsn, now=db_now(store) + HOUR, batch_size=2)
    assert report.timed_out_retried == 5
    assert report.batches >= 3  # 2 + 2 + 1 timeouts, then the other steps


# -- pending expiry --------------------------------------------------------------------------

def test_a_job_still_pending_past_expires_in_is_cancelled(
        store: Store, dsn: str) -> None:
    expiring = enqueue_one(store, expires_in_seconds=60)
    forever = enqueue_one(store)
    now = db_now(store)
    assert run(store, dsn, now=now + timedelta(seconds=30)).expired_cancelled == 0
    report = run(store, dsn, now=now + timedelta(seconds=61))
    assert report.expired_cancelled == 1
    row = store.jobs.get(expiring)
    assert row is not None
    assert (row.status, row.error) == ("cancelled", "expired before start")
    assert row.finished_at is not None
    assert store.jobs.events(expiring)[-1].reason == "expired before start"
    assert store.jobs.get(forever).status == "pending"  # type: ignore[index]


def test_a_job_that_started_in_time_does_not_expire(store: Store, dsn: str) -> None:
    job_id = enqueue_one(store, expires_in_seconds=60)
    store.attempts.claim(worker_id="w", lease_seconds=600)
    assert run(store, dsn, now=db_now(store) + HOUR).expired_cancelled == 0
    assert store.jobs.get(job_id).status == "running"  # type: ignore[index]


def test_jobs_after_an_expired_one_fail_naming_it(store: Store, dsn: str) -> None:
    first = enqueue_one(store, expires_in_seconds=60)
    [second] = store.jobs.enqueue([new_job(after=(first,), expires_in_seconds=86400)])
    report = run(store, dsn, now=db_now(store) + HOUR)
    assert report.expired_cancelled == 1 and report.dependents_failed == 1
    row = store.jobs.get(second.job_id)
    assert row is not None
    assert (row.status, row.error) == ("failed", f"dependency {first} cancelled")


def test_a_waiting_parent_that_expires_cancels_its_waiting_children(
        store: Store, dsn: str) -> None:
    blocker = enqueue_one(store)
    parent, kids = make_parent(store, 3, after=(blocker,), expires_in_seconds=60)
    assert store.jobs.children_counts(parent) == {"waiting": 3}
    report = run(store, dsn, now=db_now(store) + HOUR)
    assert report.expired_cancelled == 4
    row = store.jobs.get(parent)
    assert row is not None and row.error == "expired before start"
    assert store.jobs.children_counts(parent) == {"cancelled": 3}
    child = store.jobs.get(kids[0])
    assert child is not None and child.error == "parent expired before start"
    assert store.jobs.get(blocker).status == "pending"  # type: ignore[index]


# -- retention -------------------------------------------------------------------------------

def test_a_finished_job_past_its_ttl_loses_its_objects_then_its_rows(
        store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    old = enqueue_one(store, ttl_seconds=3600)
    finish_with_outputs(store, objects, old, files=3)
    young = enqueue_one(store, ttl_seconds=7200)
    finish_with_outputs(store, objects, young)
    [dependent] = store.jobs.enqueue([new_job(after=(old,))])  # resolved at once: pending
    now = db_now(store)
    early = run(store, dsn, now=now + timedelta(minutes=59), objects=objects)
    assert early.retention_jobs_deleted == 0 and len(keys(objects)) == 5
    report = run(store, dsn, now=now + HOUR + timedelta(seconds=5), objects=objects)
    assert (report.retention_jobs_deleted, report.retention_objects_deleted) == (1, 3)
    assert report.retention_failures == 0
    assert store.jobs.get(old) is None
    for table in ("job_outputs", "job_action_results"):
        assert count(store, table, old) == 0
    assert keys(objects, job_prefix(installation(store), old)) == []
    assert len(keys(objects, job_prefix(installation(store), young))) == 2
    assert store.jobs.get(young) is not None
    assert store.jobs.events(old), "the audit trail outlives the job"
    assert store.jobs.get(dependent.job_id) is not None


def test_a_job_without_ttl_is_kept_for_the_default_retention(
        store: Store, dsn: str) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True)
    now = db_now(store)
    kept = run(store, dsn, now=now + timedelta(days=6), retention_default="P7D")
    assert kept.retention_jobs_deleted == 0 and store.jobs.get(job_id) is not None
    gone = run(store, dsn, now=now + timedelta(days=7, seconds=5), retention_default="P7D")
    assert gone.retention_jobs_deleted == 1 and store.jobs.get(job_id) is None


def test_active_jobs_are_never_deleted(store: Store, dsn: str) -> None:
    running = enqueue_one(store, ttl_seconds=1)
    store.attempts.claim(worker_id="w", lease_seconds=600)
    pending = enqueue_one(store, ttl_seconds=1)
    waiting = store.jobs.enqueue([new_job(after=(pending,), ttl_seconds=1)])[0].job_id
    report = run(store, dsn, now=db_now(store) + timedelta(days=3650))
    assert report.retention_jobs_deleted == 0
    assert all(store.jobs.get(j) is not None for j in (running, pending, waiting))


def test_a_parent_goes_after_its_children_and_every_object_they_own(
        store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    parent, kids = make_parent(store, 5, ttl_seconds=60)
    claims = store.attempts.claim(worker_id="w", lease_seconds=600, limit=5)
    for c in claims:
        key = f"{job_prefix(installation(store), c.job_id)}{c.attempt_id}/out"
        objects.put_bytes(BUCKET, key, b"x")
        assert store.attempts.register_outputs(job_id=c.job_id, attempt_id=c.attempt_id,
                                      outputs=[("out", f"s3://{BUCKET}/{key}")])
        assert store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True)
    assert finalize_parent(store, lambda: objects, BUCKET, installation(store), parent) is not None
    assert len(keys(objects)) == 6  # five outputs and the manifest
    report = run(store, dsn, now=db_now(store) + HOUR, objects=objects, batch_size=2)
    assert report.retention_jobs_deleted == 1 and report.retention_children_deleted == 5
    assert report.retention_objects_deleted == 6 and keys(objects) == []
    assert count(store, "jobs", parent) == 0
    assert all(store.jobs.get(k) is None for k in kids)


def test_objects_that_cannot_be_deleted_keep_every_row_until_the_next_pass(
        store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    stuck = enqueue_one(store, ttl_seconds=60)
    finish_with_outputs(store, objects, stuck, files=3)
    fine = enqueue_one(store, ttl_seconds=60)
    finish_with_outputs(store, objects, fine)
    objects.fail_deletes.add(job_prefix(installation(store), stuck))
    later = db_now(store) + HOUR
    report = run(store, dsn, now=later, objects=objects, batch_size=1)
    assert report.retention_failures == 1 and report.retention_jobs_deleted == 1
    assert store.jobs.get(stuck) is not None and store.jobs.get(fine) is None
    assert count(store, "job_outputs", stuck) == 3
    assert count(store, "job_action_results", stuck) == 1
    assert len(keys(objects, job_prefix(installation(store), stuck))) == 3
    objects.fail_deletes.clear()
    retry = run(store, dsn, now=later, objects=objects)
    assert (retry.retention_failures, retry.retention_jobs_deleted) == (0, 1)
    assert store.jobs.get(stuck) is None and keys(objects) == []


def test_a_child_whose_objects_remain_keeps_the_whole_parent(
        store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    parent, kids = make_parent(store, 3, ttl_seconds=60)
    for c in store.attempts.claim(worker_id="w", lease_seconds=600, limit=3):
        key = f"{job_prefix(installation(store), c.job_id)}{c.attempt_id}/out"
        objects.put_bytes(BUCKET, key, b"x")
        store.attempts.register_outputs(job_id=c.job_id, attempt_id=c.attempt_id,
                               outputs=[("out", f"s3://{BUCKET}/{key}")])
        store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True)
    finalize_parent(store, lambda: objects, BUCKET, installation(store), parent)
    objects.fail_deletes.add(job_prefix(installation(store), kids[1]))
    later = db_now(store) + HOUR
    report = run(store, dsn, now=later, objects=objects)
    assert report.retention_failures == 1 and report.retention_jobs_deleted == 0
    assert count(store, "jobs", parent) == 4  # the parent and all three children
    assert manifest_key(installation(store), parent) in keys(objects)
    objects.fail_deletes.clear()
    assert run(store, dsn, now=later, objects=objects).retention_jobs_deleted == 1
    assert count(store, "jobs", parent) == 0 and keys(objects) == []


def test_without_a_bucket_rows_go_and_no_object_store_is_opened(
        store: Store, dsn: str) -> None:
    job_id = enqueue_one(store, ttl_seconds=60)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True)
    s = settings(dsn)
    deps = Deps(store, s, now=db_now(store) + HOUR)
    assert lifecycle.run_once(s, deps).retention_jobs_deleted == 1
    assert deps.object_store is None  # boto3 was never needed


def test_a_job_that_registered_no_outputs_costs_no_s3_call(
        store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    job_id = enqueue_one(store, ttl_seconds=60)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True)
    report = run(store, dsn, now=db_now(store) + HOUR, objects=objects)
    assert report.retention_jobs_deleted == 1 and objects.calls == []


def test_a_deleted_dependency_fails_its_waiting_dependents_as_missing(
        store: Store, dsn: str) -> None:
    done = enqueue_one(store, ttl_seconds=60)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.attempts.finish(job_id=done, attempt_id=claim.attempt_id, succeeded=True)
    other = enqueue_one(store)
    [waiting] = store.jobs.enqueue([new_job(after=(done, other))])
    assert run(store, dsn, now=db_now(store) + HOUR).retention_jobs_deleted == 1
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.attempts.finish(job_id=other, attempt_id=claim.attempt_id, succeeded=True)
    row = store.jobs.get(waiting.job_id)
    assert row is not None and (row.status, row.error) == (
        "failed", f"dependency {done} missing")


def test_each_step_stops_after_its_batch_budget(
        store: Store, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget, "MAX_BATCHES", 2)
    for _ in range(5):
        job_id = enqueue_one(store, ttl_seconds=60)
        [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
        store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True)
    later = db_now(store) + HOUR
    deleted = [run(store, dsn, now=later, batch_size=1).retention_jobs_deleted
               for _ in range(4)]
    assert deleted == [2, 2, 1, 0]


# -- audit trail and function runs -----------------------------------------------------------

def test_audit_events_and_function_runs_have_their_own_retention(
        store: Store, dsn: str) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True)
    store.conn.execute("UPDATE job_events SET at = at - interval '10 days' "
                       "WHERE to_status <> 'succeeded'")
    store.conn.execute("""
        INSERT INTO function_runs (function, status, started_at, finished_at)
        SELECT 'sweeper', 'succeeded', now() - make_interval(days => d),
               now() - make_interval(days => d)
        FROM generate_series(1, 5) d""")
    store.conn.execute("""
        INSERT INTO function_triggers (function, requested_by, reason, requested_at)
        SELECT 'sweeper', 'alice', 'check', now() - make_interval(days => d)
        FROM generate_series(1, 4) d""")
    store.queues.configure("reports", paused=True, reason="old incident", actor="alice")
    store.queues.configure("reports", paused=False, actor="alice")
    store.conn.execute("UPDATE control_events SET at = at - interval '8 days' "
                       "WHERE action = 'queue_pause'")
    report = run(store, dsn, batch_size=1, audit_retention="P7D",
                 function_runs_retention="PT60H")
    assert report.control_events_deleted == 1  # the pause, eight days ago
    assert report.events_deleted == 2  # enqueued and claimed, ten days ago
    assert [e.to_status for e in store.jobs.events(job_id)] == ["succeeded"]
    assert report.function_runs_deleted == 3  # 3, 4 and 5 days old
    assert report.function_triggers_deleted == 2  # 3 and 4 days old
    row = store.conn.execute("SELECT count(*) AS n FROM function_runs").fetchone()
    assert row is not None and row["n"] == 2
    assert store.jobs.get(job_id) is not None  # job retention is a separate setting


def test_a_second_pass_with_nothing_due_changes_nothing(store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    job_id = enqueue_one(store, ttl_seconds=60)
    finish_with_outputs(store, objects, job_id)
    later = db_now(store) + HOUR
    assert run(store, dsn, now=later, objects=objects).retention_jobs_deleted == 1
    again = run(store, dsn, now=later, objects=objects)
    counts = {k: v for k, v in asdict(again).items()
              if k not in ("function", "batches", "longest_batch_seconds")}
    assert set(counts.values()) == {0}


def test_a_job_with_more_objects_than_one_delete_call_takes_loses_them_all(
        store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    job_id = enqueue_one(store, ttl_seconds=60)
    attempt = finish_with_outputs(store, objects, job_id, files=1)
    for i in range(2500):  # e.g. files of an attempt that lost its fence mid-upload
        objects.put_bytes(BUCKET, f"{job_prefix(installation(store), job_id)}{attempt}"
                                  f"/extra/{i:05d}", b"x")
    objects.fail_deletes.add(f"{job_prefix(installation(store), job_id)}{attempt}/extra/02")
    later = db_now(store) + HOUR
    partial = run(store, dsn, now=later, objects=objects)
    assert partial.retention_failures == 1 and store.jobs.get(job_id) is not None
    # Three delete calls in key order: extra/00000-00999, 01000-01999, 02000-02499 + o0.
    assert partial.retention_objects_deleted == 2001
    assert len(keys(objects)) == 500
    objects.fail_deletes.clear()
    report = run(store, dsn, now=later, objects=objects)
    assert report.retention_objects_deleted == 500 and report.retention_jobs_deleted == 1
    assert keys(objects) == []


def test_retention_stops_for_the_pass_when_the_object_store_keeps_failing(
        store: Store, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "S3_GIVE_UP", 4)
    objects = MemoryObjectStore()
    jobs = []
    for _ in range(10):
        jobs.append(enqueue_one(store, ttl_seconds=60))
        finish_with_outputs(store, objects, jobs[-1], files=1)
    objects.fail_deletes.add("jobfence/")  # S3 refuses everything
    later = db_now(store) + HOUR
    report = run(store, dsn, now=later, objects=objects, batch_size=2)
    assert report.retention_failures == 4  # two pages, then it gives up
    assert all(store.jobs.get(j) is not None for j in jobs)
    objects.fail_deletes.clear()
    assert run(store, dsn, now=later, objects=objects).retention_jobs_deleted == 10


def test_retention_also_deletes_what_a_job_wrote_before_the_installation_had_a_name(
        store: Store, dsn: str) -> None:
    """An upgraded installation: jobs made before its identity wrote under
    jobfence/JOB_ID/; retention deletes those objects with their job."""
    objects = MemoryObjectStore()
    old = enqueue_one(store, ttl_seconds=60)
    finish_with_outputs(store, objects, old)
    legacy = f"{legacy_job_prefix(old)}{uuid7()}/part-0"
    objects.put_bytes(BUCKET, legacy, b"x")
    store.conn.execute("UPDATE jobfence_control SET identified_at = now() + interval '1 day'")
    new = enqueue_one(store, ttl_seconds=60, job_id=uuid7())  # still before the identity
    finish_with_outputs(store, objects, new)
    report = run(store, dsn, now=db_now(store) + HOUR, objects=objects)
    assert report.retention_jobs_deleted == 2 and report.retention_failures == 0
    assert keys(objects) == []


def test_retention_never_lists_the_old_layout_for_a_job_made_since(
        store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    job_id = enqueue_one(store, ttl_seconds=60)
    finish_with_outputs(store, objects, job_id)
    # Not this job's (it was made after the identity): never looked at, so never deleted.
    stranger = f"{legacy_job_prefix(job_id)}stranger"
    objects.put_bytes(BUCKET, stranger, b"x")
    report = run(store, dsn, now=db_now(store) + HOUR, objects=objects)
    assert report.retention_jobs_deleted == 1
    assert keys(objects) == [stranger]
