"""Races run as races (ADR-015): many threads, each on its own connection, released at
once by a barrier; the database alone decides, and exactly one wins."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from devtools.sqlconn import connect
from jobfence.errors import ResourceBusy
from jobfence.ids import uuid7
from jobfence.store import Store
from tests.support.factories import enqueue_one, new_job
from tests.support.races import THREADS, race

pytestmark = pytest.mark.pooled  # directly and through PgBouncer


def test_fifty_claimers_one_job_exactly_one_wins(dsn: str, store: Store) -> None:
    job_id = enqueue_one(store)
    results = race(dsn, lambda s: s.attempts.claim(worker_id="racer", lease_seconds=30))
    winners = [r for r in results if r]
    assert len(winners) == 1, results
    assert winners[0][0].job_id == job_id
    assert all(r == [] for r in results if r is not winners[0])
    events = [e for e in store.jobs.events(job_id) if e.to_status == "running"]
    assert len(events) == 1


def test_fifty_claimers_twenty_jobs_each_claimed_once(dsn: str, store: Store) -> None:
    ids = {enqueue_one(store) for _ in range(20)}
    results = race(dsn, lambda s: s.attempts.claim(worker_id="racer", lease_seconds=30))
    claimed = [c.job_id for r in results for c in r]
    assert sorted(claimed, key=str) == sorted(ids, key=str)


def test_fifty_enqueues_on_one_resource_exactly_one_succeeds(dsn: str,
                                                             store: Store) -> None:
    results = race(dsn, lambda s: s.jobs.enqueue([new_job(resource="db.events")]))
    ok = [r for r in results if isinstance(r, list)]
    busy = [r for r in results if isinstance(r, ResourceBusy)]
    assert len(ok) == 1 and len(busy) == THREADS - 1, results
    assert all(b.resource == "db.events" for b in busy)
    assert len(store.jobs.page(resource="db.events")) == 1


def test_fifty_finishers_with_the_same_fence_one_terminal_write(
        dsn: str, store: Store) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    results = race(dsn, lambda s: s.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id,
                                           succeeded=True))
    assert sum(1 for r in results if r is not None) == 1
    terminal = [e for e in store.jobs.events(job_id) if e.to_status == "succeeded"]
    assert len(terminal) == 1


def test_cancel_racing_finish_one_terminal_state(dsn: str, store: Store) -> None:
    for _ in range(10):
        job_id = enqueue_one(store)
        [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)

        def either(s: Store, i: list[int] = [0]) -> Any:
            i[0] += 1
            if i[0] % 2:
                return s.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True)
            return s.cancel(job_id=job_id)

        race(dsn, either)
        terminal = [e for e in store.jobs.events(job_id)
                    if e.to_status in ("succeeded", "cancelled")]
        assert len(terminal) == 1


def test_resource_is_free_again_once_the_holder_is_terminal(store: Store) -> None:
    first = enqueue_one(store, resource="db.t")
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    try:
        enqueue_one(store, resource="db.t")
        raise AssertionError("second enqueue should be refused")
    except ResourceBusy:
        pass
    store.attempts.finish(job_id=first, attempt_id=claim.attempt_id, succeeded=True)
    assert enqueue_one(store, resource="db.t") != first


def test_enqueue_after_racing_the_dependencys_finish_never_leaves_it_waiting(
        dsn: str, store: Store) -> None:
    """Neither side locks the other: the terminal write asks for its dependents after its
    commit (in the same round trip), the enqueue reads its dependencies again after its
    commit, so whichever commits second sees the other and the new job never stays waiting
    on a finished dependency — in every order the two can take."""
    a_conn, b_conn = connect(dsn), connect(dsn)
    try:
        for i in range(40):
            a = enqueue_one(store)
            [c] = store.attempts.claim(worker_id="w", lease_seconds=60)
            barrier = threading.Barrier(2)
            made: list[Any] = []

            def finish(a: Any = a, c: Any = c, delay: float = i / 4000) -> None:
                barrier.wait()
                time.sleep(delay)  # from 0 to 10 ms: both orders happen
                Store(a_conn).attempts.finish(job_id=a, attempt_id=c.attempt_id, succeeded=True)

            def enqueue(a: Any = a) -> None:
                barrier.wait()
                made.append(Store(b_conn).jobs.enqueue([new_job(after=(a,))])[0].job_id)

            threads = [threading.Thread(target=finish), threading.Thread(target=enqueue)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            row = store.jobs.get(made[0])
            assert row is not None and row.status == "pending", row
            store.conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() "
                               "WHERE status IN ('pending', 'running')")
    finally:
        a_conn.close()
        b_conn.close()


def test_fifty_runs_of_one_function_at_once_exactly_one_takes_the_lease(
        dsn: str, store: Store) -> None:
    results = race(dsn, lambda s: s.runs.run_started(
        function="sweeper", trigger="scheduled", holder=uuid7(), lease_seconds=30))
    winners = [r for r in results if isinstance(r, int)]
    assert len(winners) == 1, results
    assert results.count(None) == THREADS - 1
    statuses = [r.last_status for r in store.runs.function_status("sweeper")]
    assert statuses == []  # nobody finished yet
    [total] = [t for t in store.runs.function_totals("sweeper") if t.item == "run:skipped"]
    assert total.total == THREADS - 1


def test_a_lease_that_ran_out_is_taken_over_once_and_the_old_run_is_abandoned(
        dsn: str, store: Store) -> None:
    old = uuid7()
    first = store.runs.run_started(function="lifecycle", trigger="scheduled", holder=old,
                                   lease_seconds=0.2)
    time.sleep(0.3)
    results = race(dsn, lambda s: s.runs.run_started(
        function="lifecycle", trigger="scheduled", holder=uuid7(), lease_seconds=30))
    assert len([r for r in results if isinstance(r, int)]) == 1, results
    # The old holder can neither renew nor free the new holder's lease.
    assert not store.runs.lease_renew(function="lifecycle", holder=old, lease_seconds=30)
    store.runs.lease_release(function="lifecycle", holder=old)
    assert store.runs.run_started(function="lifecycle", trigger="scheduled", holder=uuid7(),
                                  lease_seconds=30) is None
    runs = {r["run_id"]: r for r in store.conn.execute(
        "SELECT run_id, status, error FROM jobfence.function_runs").fetchall()}
    assert runs[first]["status"] == "interrupted" and "abandoned" in runs[first]["error"]
