"""Rules that must hold whichever verb moved the job, on a real database:

* a queue's limit on running jobs counts a cancelled attempt that is still stopping (it
  keeps its resource, and its slot, until its worker confirms or its lease runs out);
* `retry` (one job or in bulk) of a job with `after` dependencies waits for them as an
  enqueue does — runnable once they all succeeded, failed when one failed, was cancelled or
  is gone;
* `expires_in` ("cancelled if not started by then") expires only jobs that never started:
  a job snoozed, waiting for its retry, given back on SIGTERM or reclaimed has started.
"""

from __future__ import annotations

import time

import pytest

from jobfence import bulk
from jobfence.db import Connection
from jobfence.store import RetryPolicy, Store
from tests.support.factories import enqueue_one

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

NOW_RETRY = RetryPolicy(base_seconds=0, cap_seconds=0)


# -- a queue's limit counts stopping attempts ---------------------------------------------


def test_a_queue_limit_counts_a_cancelled_attempt_still_stopping(store: Store) -> None:
    store.queues.configure("one", limit=1, set_limit=True)
    first = enqueue_one(store, queue="one")
    [claim] = store.attempts.claim(worker_id="w1", lease_seconds=60, queue="one")
    store.jobs.cancel(job_id=first, reason="not needed")
    second = enqueue_one(store, queue="one")
    # The first attempt's command may still run: the queue's one slot is still taken.
    assert store.attempts.claim(worker_id="w2", lease_seconds=60, queue="one") == []
    assert store.attempts.stopped(job_id=first, attempt_id=claim.attempt_id)
    [next_claim] = store.attempts.claim(worker_id="w2", lease_seconds=60, queue="one")
    assert next_claim.job_id == second


def test_a_stopping_attempt_frees_its_queue_slot_when_its_lease_runs_out(
        store: Store) -> None:
    store.queues.configure("one", limit=1, set_limit=True)
    first = enqueue_one(store, queue="one")
    store.attempts.claim(worker_id="w1", lease_seconds=0.3, queue="one")
    store.jobs.cancel(job_id=first, reason="not needed")
    second = enqueue_one(store, queue="one")
    assert store.attempts.claim(worker_id="w2", lease_seconds=60, queue="one") == []
    time.sleep(0.4)  # its worker never confirmed; self-fencing ended it by its lease's end
    [next_claim] = store.attempts.claim(worker_id="w2", lease_seconds=60, queue="one")
    assert next_claim.job_id == second


def test_a_queue_limit_counts_a_timed_out_attempt_still_stopping(
        store: Store, conn: Connection) -> None:
    store.queues.configure("one", limit=1, set_limit=True)
    first = enqueue_one(store, queue="one", max_attempts=3)
    store.attempts.claim(worker_id="w1", lease_seconds=60, queue="one")
    conn.execute("UPDATE jobs SET run_deadline_at = now() - interval '1 s' WHERE job_id = %s",
                 (first,))
    store.maintenance.reclaim_timed_out(retry=NOW_RETRY, batch_size=10)
    enqueue_one(store, queue="one")
    assert store.attempts.claim(worker_id="w2", lease_seconds=60, queue="one") == []


# -- a retry waits for its dependencies ---------------------------------------------------


def _waiting_job_cancelled(store: Store, dependency: object) -> object:
    job = enqueue_one(store, after=[dependency])
    store.jobs.cancel(job_id=job, reason="not now")  # type: ignore[arg-type]
    return job


def test_a_retried_job_waits_for_a_dependency_still_running(store: Store) -> None:
    dep = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    job = _waiting_job_cancelled(store, dep)
    assert store.jobs.retry(job_id=job, reason="again").status == "waiting"  # type: ignore[arg-type]
    assert store.attempts.claim(worker_id="w", lease_seconds=60) == []
    store.attempts.finish(job_id=dep, attempt_id=claim.attempt_id, succeeded=True)
    assert store.jobs.get(job).status == "pending"  # type: ignore[arg-type,union-attr]


def test_a_retried_job_whose_dependency_failed_fails_as_an_enqueue_would(
        store: Store) -> None:
    dep = enqueue_one(store, max_attempts=1)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    job = enqueue_one(store, after=[dep])
    store.attempts.finish(job_id=dep, attempt_id=claim.attempt_id, succeeded=False,
                          error="boom")
    row = store.jobs.get(job)
    assert row is not None and row.status == "failed"
    t = store.jobs.retry(job_id=job, reason="again")
    assert t.status == "failed"
    row = store.jobs.get(job)
    assert row is not None and row.status == "failed"
    assert row.error == f"dependency {dep} failed"
    assert store.attempts.claim(worker_id="w", lease_seconds=60) == []


def test_a_retried_job_whose_dependencies_succeeded_is_pending_at_once(store: Store) -> None:
    dep = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.attempts.finish(job_id=dep, attempt_id=claim.attempt_id, succeeded=True)
    job = _waiting_job_cancelled(store, dep)
    assert store.jobs.retry(job_id=job, reason="again").status == "pending"  # type: ignore[arg-type]


def test_a_bulk_retry_of_a_failed_chain_waits_for_the_dependency_it_retries(
        store: Store) -> None:
    dep = enqueue_one(store, max_attempts=1)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    job = enqueue_one(store, after=[dep])
    store.attempts.finish(job_id=dep, attempt_id=claim.attempt_id, succeeded=False,
                          error="boom")
    # Newest first: the dependent is retried in the first page, its dependency in the next.
    out = bulk.act(store, "retry", bulk.Selection(statuses=("failed",)), reason="again",
                   limit=10, batch=1)
    assert out.done == 2 and out.batches == 2
    assert store.jobs.get(job).status == "waiting"  # type: ignore[union-attr]
    assert store.jobs.get(dep).status == "pending"  # type: ignore[union-attr]
    [again] = store.attempts.claim(worker_id="w", lease_seconds=60)
    assert again.job_id == dep
    store.attempts.finish(job_id=dep, attempt_id=again.attempt_id, succeeded=True)
    assert store.jobs.get(job).status == "pending"  # type: ignore[union-attr]


def test_a_bulk_retry_fails_a_job_whose_dependency_stays_failed(store: Store) -> None:
    dep = enqueue_one(store, max_attempts=1)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    job = enqueue_one(store, after=[dep])
    store.attempts.finish(job_id=dep, attempt_id=claim.attempt_id, succeeded=False,
                          error="boom")
    out = bulk.act(store, "retry", bulk.Selection(job_ids=(job,)), reason="again",  # type: ignore[arg-type]
                   limit=10, batch=10)
    assert out.done == 1
    row = store.jobs.get(job)  # type: ignore[arg-type]
    assert row is not None and row.status == "failed"
    assert row.error == f"dependency {dep} failed"


# -- expiry only of jobs never started ----------------------------------------------------


@pytest.mark.parametrize("give_back", ["snooze", "failure", "sigterm", "reclaim"])
def test_a_job_that_started_never_expires(store: Store, conn: Connection,
                                          give_back: str) -> None:
    job = enqueue_one(store, expires_in_seconds=3600, max_attempts=3)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    if give_back == "snooze":
        store.attempts.snooze(job_id=job, attempt_id=claim.attempt_id, delay_seconds=600,
                              reason="snoozed", max_snoozes=5)
    elif give_back == "failure":
        store.attempts.release(job_id=job, attempt_id=claim.attempt_id, reason="failed",
                               retry=RetryPolicy(base_seconds=600, cap_seconds=600))
    elif give_back == "sigterm":
        store.attempts.interrupt(job_id=job, attempt_id=claim.attempt_id,
                                 reason="worker received SIGTERM", max_interruptions=5)
    else:
        conn.execute("UPDATE jobs SET visible_at = now() - interval '1 s' WHERE job_id = %s",
                     (job,))
        store.maintenance.reclaim_expired(retry=NOW_RETRY, batch_size=10)
    assert store.jobs.get(job).status == "pending"  # type: ignore[union-attr]
    conn.execute("UPDATE jobs SET expires_at = now() - interval '1 s' WHERE job_id = %s",
                 (job,))
    moved, _ = store.maintenance.expire_pending(batch_size=10)
    assert moved.done == []
    assert store.jobs.get(job).status == "pending"  # type: ignore[union-attr]


def test_a_job_never_started_still_expires(store: Store, conn: Connection) -> None:
    job = enqueue_one(store, expires_in_seconds=3600)
    conn.execute("UPDATE jobs SET expires_at = now() - interval '1 s' WHERE job_id = %s",
                 (job,))
    moved, _ = store.maintenance.expire_pending(batch_size=10)
    assert [t.job_id for t in moved.done] == [job]
    assert store.jobs.get(job).status == "cancelled"  # type: ignore[union-attr]
