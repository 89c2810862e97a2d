"""A worker waiting for work is told when its queue has some (worker/wakeup.py), on a real
database: the notifications the database sends (a queue's pending work, once per queue and
statement), an idle worker woken by an enqueue long before its poll, a busy worker's free
slot starting a scheduled job when it is due and not at its next look (worker_next_due), a
notification lost with its connection costing one poll and the worker listening again, and
no listening at all behind a transaction pooler."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobfence import db
from jobfence.settings import Settings
from jobfence.store import RetryPolicy, Store
from jobfence.worker import loop
from jobfence.worker.loop import Worker
from jobfence.worker.wakeup import channel
from tests.support import Dsn
from tests.support.factories import enqueue_one, new_job
from tests.support.procs import wait_for


@pytest.fixture
def told(dsn: Dsn) -> Iterator[psycopg.Connection[Any]]:
    """A connection listening where the workers do."""
    with psycopg.connect(dsn.direct, autocommit=True) as conn:
        conn.execute(f'LISTEN "{channel("jobfence")}"')
        yield conn


def payloads(conn: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.5)]


def test_the_database_names_each_queue_with_pending_work_once_per_statement(
        store: Store, told: psycopg.Connection[Any]) -> None:
    store.jobs.enqueue([new_job(queue="a") for _ in range(5)] + [new_job(queue="b")])
    assert sorted(payloads(told)) == ["a", "b"]
    store.jobs.enqueue([new_job(queue="c", delay_seconds=3600)])  # ready later: told too,
    assert payloads(told) == ["c"]  # so that a busy worker learns when (worker_next_due)
    job = enqueue_one(store, queue="d")
    assert payloads(told) == ["d"]
    [claim] = store.attempts.claim(worker_id="w1", lease_seconds=30, queue="d")
    assert claim.job_id == job
    assert payloads(told) == []  # running is not ready
    store.attempts.release(job_id=claim.job_id, attempt_id=claim.attempt_id, reason="failed",
                           error="boom", retry=RetryPolicy(base_seconds=0, cap_seconds=0))
    assert payloads(told) == ["d"]  # a retry due now is ready again


def test_the_next_due_is_the_soonest_job_not_ready_yet_of_any_priority(store: Store) -> None:
    assert store.attempts.next_due("q") is None
    enqueue_one(store, queue="q")  # ready now: not due later
    enqueue_one(store, queue="other", delay_seconds=5)
    assert store.attempts.next_due("q") is None
    enqueue_one(store, queue="q", delay_seconds=900, priority=9)
    enqueue_one(store, queue="q", delay_seconds=600, priority=-3)
    enqueue_one(store, queue="q", delay_seconds=3600)
    due = store.attempts.next_due("q")
    assert due is not None and 590 < due <= 600
    store.jobs.enqueue([new_job(queue="q", delay_seconds=60, priority=p) for p in range(100)])
    due = store.attempts.next_due("q")  # the first 64 priorities walked, from the top
    assert due is not None and 50 < due <= 60


def test_a_busy_workers_free_slot_starts_a_scheduled_job_when_due_not_at_its_next_look(
        dsn: Dsn, store: Store, conn: psycopg.Connection[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "BUSY_POLL_SECONDS", 60.0)
    long = enqueue_one(store, actions=[{"name": "sleep", "params": {"seconds": 4}}])
    worker = Worker(Settings(database_url=dsn, lease_seconds=30), concurrency=2)

    def schedule_once_running() -> None:
        wait_for(lambda: worker.report.claimed == 1, timeout=20)
        time.sleep(0.3)  # the free slot has looked: its next look is a minute away
        with db.connect(dsn) as own:
            enqueue_one(Store(own), delay_seconds=1.0)

    helper = meanwhile(schedule_once_running)
    report = worker.run(max_jobs=2)
    helper.join(5)
    assert report.succeeded == 2, report
    rows = {r["job_id"]: r for r in conn.execute(
        "SELECT job_id, run_at, started_at, finished_at FROM jobs")}
    scheduled = next(r for j, r in rows.items() if j != long)
    assert scheduled["started_at"] >= scheduled["run_at"]  # never before it is due
    # ... and not when the long job's end made the next claim: its free slot woke for it
    assert scheduled["started_at"] < rows[long]["finished_at"]


def meanwhile(fn: Callable[[], None]) -> threading.Thread:
    """``fn`` on a thread of its own while the worker runs on the test's (it takes the
    signals)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_an_idle_worker_is_woken_by_an_enqueue_long_before_its_poll(
        dsn: Dsn, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "IDLE_POLL_SECONDS", 60.0)
    worker = Worker(Settings(database_url=dsn, lease_seconds=30))

    def enqueue_once_listening() -> None:
        wait_for(lambda: worker._wakeup is not None and worker._wakeup.listening.is_set(),
                 timeout=20)
        time.sleep(0.5)  # the look its listening started is done: the poll's next is a minute
        with db.connect(dsn) as own:
            enqueue_one(Store(own), actions=[{"name": "sleep", "params": {"seconds": 0}}])

    helper = meanwhile(enqueue_once_listening)
    started = time.monotonic()
    report = worker.run(max_jobs=1, idle_seconds=120)
    helper.join(5)
    assert report.listened and report.succeeded == 1
    # Found at the next poll it would have taken a minute: it was woken.
    assert time.monotonic() - started < 30


def test_a_notification_lost_with_its_connection_costs_one_poll_and_listening_resumes(
        dsn: Dsn, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "IDLE_POLL_SECONDS", 2.0)
    worker = Worker(Settings(database_url=dsn, lease_seconds=30))
    seen: dict[str, int] = {}

    def lose_the_connection_then_enqueue_twice() -> None:
        wait_for(lambda: worker._wakeup is not None and worker._wakeup.listening.is_set(),
                 timeout=20)
        wakeup = worker._wakeup
        assert wakeup is not None
        with psycopg.connect(dsn.direct, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'jobfence-wakeup'").fetchone()
            seen["killed"] = row[0] if row else 0
        with db.connect(dsn) as conn:
            own = Store(conn)
            enqueue_one(own, actions=[{"name": "sleep", "params": {"seconds": 0}}])
            wait_for(lambda: worker.report.succeeded == 1, timeout=30)  # the poll found it
            wait_for(lambda: wakeup.times_listened == 2 and wakeup.listening.is_set(),
                     timeout=30)
            seen["listened"] = wakeup.times_listened
            enqueue_one(own, actions=[{"name": "sleep", "params": {"seconds": 0}}])

    helper = meanwhile(lose_the_connection_then_enqueue_twice)
    report = worker.run(max_jobs=2, idle_seconds=60)
    helper.join(5)
    assert seen == {"killed": 1, "listened": 2}
    assert report.succeeded == 2


@pytest.mark.parametrize("route", ["pgbouncer"], indirect=True)
def test_behind_a_transaction_pooler_the_worker_polls_without_listening(
        dsn: Dsn, store: Store) -> None:
    enqueue_one(store, actions=[{"name": "sleep", "params": {"seconds": 0}}])
    worker = Worker(Settings(database_url=dsn, database_pooler=dsn.pooler, lease_seconds=30))
    report = worker.run(max_jobs=1, idle_seconds=1)
    assert worker._wakeup is not None and not worker._wakeup.enabled
    assert not report.listened and report.succeeded == 1
