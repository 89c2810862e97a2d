"""Rules that must hold whichever verb moved the job, on a real database:

* a queue's limit on running jobs counts a cancelled attempt that is still stopping (it
  keeps its resource, and its slot, until its worker confirms or its lease runs out);
* `expires_in` ("cancelled if not started by then") expires only jobs that never started:
  a job snoozed, waiting for its retry, given back on SIGTERM or reclaimed has started.
"""

from __future__ import annotations

import time

import pytest

from jobfence.db import Connection
from jobfence.store import RetryPolicy, Store
from tests.factories import enqueue_one

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
