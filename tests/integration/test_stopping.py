"""A rotated fence whose attempt may still be running (invariant 12): a cancel, a run
timeout enforced by lifecycle, a pod whose node stopped answering. The attempt is kept
"stopping" until its worker confirms its command is gone or its lease has run out:
meanwhile its job keeps its resource, is not claimed again and is not retried; once the
lease has run out the retry may go on and the sweeper lets the resource go.

Also what else the operator's and the worker's functions refuse: a child whose parent has
finished is not retried, and the worker's numbers are bounded in the database too.
"""

from __future__ import annotations

import threading
import time
from uuid import uuid4

import pytest

from jobfence.errors import (
    InvalidSpec,
    JobAlreadyTerminal,
    JobNotFound,
    NotRetryable,
    ResourceBusy,
)
from jobfence.store import RetryPolicy, Store
from tests.support.factories import enqueue_one, new_job

pytestmark = pytest.mark.pooled  # directly and through PgBouncer


def test_cancel_of_a_running_job_keeps_its_resource_until_the_attempt_confirms(
        store: Store) -> None:
    job = enqueue_one(store, resource="db.events")
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    [t] = store.jobs.cancel(job_id=job, reason="not needed")
    assert t.status == "cancelled"
    row = store.jobs.get(job)
    assert row is not None and row.stopping_until is not None
    with pytest.raises(ResourceBusy):
        enqueue_one(store, resource="db.events")
    with pytest.raises(NotRetryable, match="still stopping"):
        store.jobs.retry(job_id=job, reason="again")
    # The worker's stop check finds the fence gone; it kills its command and confirms.
    assert store.attempts.holding([(job, claim.attempt_id)]) == set()
    assert store.attempts.stopped(job_id=job, attempt_id=claim.attempt_id)
    assert not store.attempts.stopped(job_id=job, attempt_id=claim.attempt_id)  # once
    row = store.jobs.get(job)
    assert row is not None and row.stopping_until is None
    assert store.jobs.retry(job_id=job, reason="again").status == "pending"


def test_an_attempt_that_never_confirms_is_let_go_when_its_lease_ends(store: Store) -> None:
    job = enqueue_one(store, resource="db.events")
    store.attempts.claim(worker_id="w", lease_seconds=0.3)
    store.jobs.cancel(job_id=job, reason="not needed")
    with pytest.raises(ResourceBusy):
        enqueue_one(store, resource="db.events")
    time.sleep(0.4)
    assert store.maintenance.release_stopped(batch_size=10) == [job]
    enqueue_one(store, resource="db.events")  # free again
    row = store.jobs.get(job)
    assert row is not None and row.stopping_until is None


def test_retry_goes_on_once_the_stopping_attempts_lease_has_ended(store: Store) -> None:
    job = enqueue_one(store)
    store.attempts.claim(worker_id="w", lease_seconds=0.3)
    store.jobs.cancel(job_id=job, reason="not needed")
    with pytest.raises(NotRetryable, match="still stopping"):
        store.jobs.retry(job_id=job, reason="again")
    time.sleep(0.4)
    assert store.jobs.retry(job_id=job, reason="again").status == "pending"
    [again] = store.attempts.claim(worker_id="w2", lease_seconds=60)
    assert again.job_id == job


def test_a_cancel_of_a_job_that_never_ran_leaves_nothing_stopping(store: Store) -> None:
    job = enqueue_one(store, resource="db.events")
    store.jobs.cancel(job_id=job, reason="not needed")
    row = store.jobs.get(job)
    assert row is not None and row.stopping_until is None
    enqueue_one(store, resource="db.events")


def test_cancel_refuses_a_finished_or_unknown_job_and_changes_nothing(store: Store) -> None:
    job = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    assert store.attempts.finish(job_id=job, attempt_id=claim.attempt_id, succeeded=True)
    with pytest.raises(JobAlreadyTerminal, match="already succeeded"):
        store.jobs.cancel(job_id=job)
    with pytest.raises(JobNotFound):
        store.jobs.cancel(job_id=uuid4())
    assert [e.to_status for e in store.jobs.events(job)] == ["pending", "running", "succeeded"]


def test_a_lost_stop_confirmation_is_harmless_and_names_only_its_own_attempt(
        store: Store) -> None:
    job = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.jobs.cancel(job_id=job, reason="x")
    assert not store.attempts.stopped(job_id=job, attempt_id=uuid4())
    row = store.jobs.get(job)
    assert row is not None and row.stopping_until is not None
    assert store.attempts.stopped(job_id=job, attempt_id=claim.attempt_id)


def test_concurrent_retries_of_a_stopped_job_make_one_pending_run(store: Store,
                                                                 dsn: str) -> None:
    """Race: eight operators retry the same cancelled job at once, the moment its attempt
    confirms: exactly one retry wins, the others are refused (already pending)."""
    from devtools.sqlconn import connect
    from jobfence.db import connect as jf_connect

    job = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.jobs.cancel(job_id=job, reason="x")
    stores = [Store(jf_connect(dsn, pooler=getattr(dsn, "pooler", "none"))) for _ in range(8)]
    start = threading.Barrier(len(stores) + 1)
    outcomes: list[str] = []

    def retry(s: Store) -> None:
        start.wait()
        try:
            s.jobs.retry(job_id=job, reason="again")
            outcomes.append("retried")
        except NotRetryable:
            outcomes.append("refused")

    threads = [threading.Thread(target=retry, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    assert store.attempts.stopped(job_id=job, attempt_id=claim.attempt_id)
    start.wait()
    for t in threads:
        t.join()
    for s in stores:
        s.conn.close()
    assert sorted(outcomes) == ["refused"] * 7 + ["retried"]
    with connect(dsn) as conn:
        retries = conn.execute("SELECT count(*) AS n FROM job_events WHERE job_id = %s "
                               "AND from_status = 'cancelled'", (job,)).fetchone()
    assert retries is not None and retries["n"] == 1


def test_a_child_of_a_finished_parent_is_not_retried(store: Store) -> None:
    parent = new_job(is_parent=True)
    store.jobs.enqueue([parent])
    child = enqueue_one(store, parent_id=parent.job_id)
    store.jobs.cancel(job_id=parent.job_id, reason="stop it all")
    row = store.jobs.get(child)
    assert row is not None and row.status == "cancelled"
    with pytest.raises(NotRetryable, match=r"child of .* which is cancelled"):
        store.jobs.retry(job_id=child, reason="sneak it back in")
    assert store.attempts.claim(worker_id="w", lease_seconds=60) == []


@pytest.mark.parametrize("lease", [-1.0, 0.0, 86_401.0, float("inf"), float("nan")])
def test_the_database_bounds_the_lease_a_worker_asks_for(store: Store, lease: float) -> None:
    enqueue_one(store)
    with pytest.raises(InvalidSpec, match="lease_seconds must be between"):
        store.attempts.claim(worker_id="w", lease_seconds=lease)


def test_the_database_bounds_the_retry_delays_a_worker_asks_for(store: Store) -> None:
    job = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    with pytest.raises(InvalidSpec, match="base_seconds must be between"):
        store.attempts.release(job_id=job, attempt_id=claim.attempt_id, reason="x",
                               retry=RetryPolicy(-5, 10))
    assert store.attempts.heartbeat(job_id=job, attempt_id=claim.attempt_id,
                                    lease_seconds=60) is not None


def test_a_stop_told_while_a_statement_ran_on_the_guards_connection_is_not_lost(
        dsn: str) -> None:
    """The notification arrives while a heartbeat holds the guards' connection: the driver
    reads it with that statement's answer, so the socket has nothing more to say. It is
    still told at once, not at the next safety-net check (seconds later)."""
    from devtools.sqlconn import connect
    from jobfence.settings import load_settings
    from jobfence.worker.side_channel import SideChannel

    side = SideChannel(load_settings(database_url=dsn))
    try:
        side.call(lambda s: s.schedules.clock())  # connected and listening
        assert side.listening
        with connect(dsn) as other:
            def notify_soon() -> None:
                time.sleep(0.2)
                other.execute("SELECT pg_notify('jobfence.stop', 'job-1')")

            sender = threading.Thread(target=notify_soon)
            sender.start()
            side.call(lambda s: s.conn.execute("SELECT pg_sleep(0.5)"))  # a slow heartbeat
            sender.join()
        assert side.told(0.05) == {"job-1"}
        assert side.told(0.05) == set()  # once
    finally:
        side.close_quietly()
