"""A job that resumes — after a failed attempt, a snooze, a SIGTERM give-back or a reclaim —
skips the actions that succeeded earlier in its run, and keeps what they made: their
outputs stay owned (orphan-cleanup never deletes them while the job may still use or list
them), and a datum parent's manifest lists them. An operator's `retry` starts a new run:
what succeeded before it is done no longer, and no longer owned.

On a real database, with the real orphan-cleanup pass over an in-memory object store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from devtools.memory_objects import MemoryObjectStore
from jobfence.db import Connection
from jobfence.objectstore import attempt_prefix, s3_url
from jobfence.passes.orphan_cleanup import Report, clean_objects
from jobfence.store import RetryPolicy, Store
from jobfence.store.types import ActionOutcome, Claim
from tests.support.factories import enqueue_one, installation, make_parent

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

NOW_RETRY = RetryPolicy(base_seconds=0, cap_seconds=0)
TWO = [{"name": "sleep", "params": {"seconds": 0}}, {"name": "sleep", "params": {"seconds": 0}}]


def _claim(store: Store) -> Claim:
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    return claim


def _outcome(index: int, ok: bool, outputs: list[str] | None = None) -> ActionOutcome:
    return ActionOutcome(index, "sleep", ok, datetime.now(UTC),
                         result={"outputs": outputs} if outputs is not None else None,
                         error=None if ok else "boom")


def _publish(store: Store, claim: Claim, bucket: str, objects: MemoryObjectStore,
             name: str) -> str:
    """What a command's publish does: register, upload, confirm — the URL."""
    key = attempt_prefix(installation(store), claim.job_id, claim.attempt_id) + name
    url = s3_url(bucket, key)
    assert store.attempts.register_outputs(job_id=claim.job_id, attempt_id=claim.attempt_id,
                                           outputs=[(name, url)])
    objects.put_bytes(bucket, key, b"made by " + str(claim.attempt_id).encode())
    assert store.attempts.confirm_outputs(job_id=claim.job_id, attempt_id=claim.attempt_id,
                                          outputs=[{"path": name, "status": "done",
                                                    "size_bytes": 1, "error": None}])
    return url


def _first_action_then(store: Store, claim: Claim, objects: MemoryObjectStore,
                       name: str = "a.txt") -> str:
    """The claim's first action succeeds, publishing one output; its URL."""
    url = _publish(store, claim, "out", objects, name)
    assert store.attempts.record_action(job_id=claim.job_id, attempt_id=claim.attempt_id,
                                        outcome=_outcome(0, True, [url]))
    return url


def _cleanup(store: Store, objects: MemoryObjectStore) -> Report:
    """An orphan-cleanup pass for which every object is past the grace period."""
    report = Report(function="orphan-cleanup", cluster="none")
    clean_objects(store, objects, "out", installation(store),
                  cutoff=datetime.now(UTC) + timedelta(days=1), c=report)
    return report


def _keys(objects: MemoryObjectStore) -> set[str]:
    return {o.key for o in objects.iter_objects("out", "")}


def _listed_outputs(store: Store, job_id: UUID) -> list[str]:
    """Every output URL `status` lists for the job."""
    from jobfence.views import job_views

    row = store.jobs.get(job_id)
    assert row is not None
    [view] = job_views(store, [row])
    return [u for a in view["actions"] for u in (a.get("result") or {}).get("outputs") or []]


# -- what a resumed run made stays -------------------------------------------------------


@pytest.mark.parametrize("give_back", ["failure", "snooze", "sigterm", "reclaim"])
def test_outputs_of_an_earlier_attempt_of_the_run_stay_owned_and_present(
        store: Store, conn: Connection, give_back: str) -> None:
    objects = MemoryObjectStore()
    job = enqueue_one(store, actions=TWO, max_attempts=3)
    first = _claim(store)
    url = _first_action_then(store, first, objects)
    if give_back == "failure":
        store.attempts.release(job_id=job, attempt_id=first.attempt_id, reason="failed",
                               retry=NOW_RETRY, outcome=_outcome(1, False))
    elif give_back == "snooze":
        store.attempts.snooze(job_id=job, attempt_id=first.attempt_id, delay_seconds=0.001,
                              reason="snoozed", max_snoozes=5)
    elif give_back == "sigterm":
        store.attempts.interrupt(job_id=job, attempt_id=first.attempt_id,
                                 reason="worker received SIGTERM", max_interruptions=5)
    else:
        conn.execute("UPDATE jobs SET visible_at = now() - interval '1 s' WHERE job_id = %s",
                     (job,))
        store.maintenance.reclaim_expired(retry=NOW_RETRY, batch_size=10)
    conn.execute("UPDATE jobs SET visible_at = now() WHERE job_id = %s", (job,))
    # While the job waits to resume, the first attempt's outputs are still needed.
    _cleanup(store, objects)
    assert _keys(objects) == {url.removeprefix("s3://out/")}
    second = _claim(store)
    assert second.may_resume
    assert store.attempts.done_actions(job, second.attempt_id) == {0}
    _cleanup(store, objects)  # while it runs
    assert _keys(objects) == {url.removeprefix("s3://out/")}
    assert store.attempts.finish(job_id=job, attempt_id=second.attempt_id, succeeded=True,
                                 outcome=_outcome(1, True, [])) is not None
    report = _cleanup(store, objects)  # once it succeeded
    assert report.orphaned_objects_deleted == 0
    assert _keys(objects) == {url.removeprefix("s3://out/")}
    assert _listed_outputs(store, job) == [url]
    assert store.pods.object_owners([(job, first.attempt_id)]) == {
        (job, first.attempt_id): "keep"}


def test_outputs_of_an_attempt_that_succeeded_nothing_are_still_garbage(
        store: Store) -> None:
    objects = MemoryObjectStore()
    job = enqueue_one(store, actions=TWO, max_attempts=3)
    first = _claim(store)
    partial = _publish(store, first, "out", objects, "partial.txt")  # then action 1 fails
    store.attempts.release(job_id=job, attempt_id=first.attempt_id, reason="failed",
                           retry=NOW_RETRY, outcome=_outcome(0, False))
    second = _claim(store)
    assert store.attempts.done_actions(job, second.attempt_id) == set()
    _first_action_then(store, second, objects, "a.txt")
    store.attempts.finish(job_id=job, attempt_id=second.attempt_id, succeeded=True,
                          outcome=_outcome(1, True, []))
    report = _cleanup(store, objects)
    assert report.orphaned_objects_deleted == 1
    assert partial.removeprefix("s3://out/") not in _keys(objects)


def test_the_manifest_lists_the_outputs_of_a_resumed_datum(store: Store) -> None:
    objects = MemoryObjectStore()
    parent, [child] = make_parent(store, 1, actions=TWO)
    first = _claim(store)
    url_a = _first_action_then(store, first, objects, "a.txt")
    store.attempts.interrupt(job_id=child, attempt_id=first.attempt_id,
                             reason="worker received SIGTERM", max_interruptions=5)
    second = _claim(store)
    assert store.attempts.done_actions(child, second.attempt_id) == {0}
    url_b = _publish(store, second, "out", objects, "b.txt")
    store.attempts.finish(job_id=child, attempt_id=second.attempt_id, succeeded=True,
                          outcome=_outcome(1, True, [url_b]))
    [entry] = store.parents.children_page(parent_id=parent, after=UUID(int=0), limit=10)
    assert entry.status == "succeeded"
    assert sorted(entry.outputs) == sorted([url_a, url_b])
    _cleanup(store, objects)
    assert _keys(objects) == {url_a.removeprefix("s3://out/"), url_b.removeprefix("s3://out/")}


# -- an operator's retry starts a new run ------------------------------------------------


def test_after_a_retry_actions_that_succeeded_before_it_are_run_again(
        store: Store, conn: Connection) -> None:
    job = enqueue_one(store, actions=TWO, max_attempts=1)
    first = _claim(store)
    assert store.attempts.record_action(job_id=job, attempt_id=first.attempt_id,
                                        outcome=_outcome(0, True))
    t = store.attempts.release(job_id=job, attempt_id=first.attempt_id, reason="failed",
                               retry=NOW_RETRY, outcome=_outcome(1, False))
    assert t is not None and t.status == "failed"
    conn.execute("UPDATE jobs SET max_attempts = 2 WHERE job_id = %s", (job,))
    assert store.jobs.retry(job_id=job, reason="again").status == "pending"
    # The new run: its first action fails in every attempt.
    second = _claim(store)
    store.attempts.release(job_id=job, attempt_id=second.attempt_id, reason="failed",
                           retry=NOW_RETRY, outcome=_outcome(0, False))
    third = _claim(store)
    assert third.may_resume
    assert store.attempts.done_actions(job, third.attempt_id) == set()


def test_status_shows_an_action_succeeded_only_in_the_current_run(
        store: Store, conn: Connection) -> None:
    job = enqueue_one(store, actions=TWO, max_attempts=1)
    first = _claim(store)
    store.attempts.record_action(job_id=job, attempt_id=first.attempt_id,
                                 outcome=_outcome(0, True))
    store.attempts.release(job_id=job, attempt_id=first.attempt_id, reason="failed",
                           retry=NOW_RETRY, outcome=_outcome(1, False))
    store.jobs.retry(job_id=job, reason="again")
    second = _claim(store)
    store.attempts.release(job_id=job, attempt_id=second.attempt_id, reason="failed",
                           retry=NOW_RETRY, outcome=_outcome(0, False))
    from jobfence.views import job_views

    row = store.jobs.get(job)
    assert row is not None and row.status == "failed"
    [view] = job_views(store, [row])
    assert [a["status"] for a in view["actions"]] == ["failed", "skipped"]


def test_outputs_of_a_run_before_a_retry_are_no_longer_owned(store: Store) -> None:
    objects = MemoryObjectStore()
    job = enqueue_one(store, actions=TWO, max_attempts=1)
    first = _claim(store)
    old = _first_action_then(store, first, objects)
    store.attempts.release(job_id=job, attempt_id=first.attempt_id, reason="failed",
                           retry=NOW_RETRY, outcome=_outcome(1, False))
    store.jobs.retry(job_id=job, reason="again")
    second = _claim(store)
    new = _first_action_then(store, second, objects)
    store.attempts.finish(job_id=job, attempt_id=second.attempt_id, succeeded=True,
                          outcome=_outcome(1, True, []))
    _cleanup(store, objects)
    assert _keys(objects) == {new.removeprefix("s3://out/")}
    assert old.removeprefix("s3://out/") not in _keys(objects)
    assert _listed_outputs(store, job) == [new]
