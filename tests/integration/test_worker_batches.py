"""The worker's batched verbs on a real database (directly and through PgBouncer): one
statement renews, finishes or gives back many attempts, each row matched on its own
(job_id, attempt_id) and a live lease, the ones that matched returned — a lost fence costs
its own row only — and claims ride on a batch of terminal writes, each a fresh fence."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from jobfence.db import Connection
from jobfence.store import ActionOutcome, ClaimRequest, Store, TerminalWrite
from tests.support.factories import enqueue_one
from tests.support.races import THREADS, race

pytestmark = pytest.mark.pooled

NOW = dt.datetime.now(dt.UTC)


def terminal_events(store: Store, job_id: Any) -> list[str]:
    return [e.to_status for e in store.jobs.events(job_id)
            if e.to_status in ("succeeded", "failed", "cancelled")]


def test_heartbeat_many_renews_each_row_on_its_own_fence(store: Store) -> None:
    jobs = [enqueue_one(store) for _ in range(3)]
    claims = store.attempts.claim(worker_id="w", lease_seconds=5, limit=3)
    assert {c.job_id for c in claims} == set(jobs)
    store.jobs.cancel(job_id=claims[1].job_id)
    renewed = store.attempts.heartbeat_many(
        [(c.job_id, c.attempt_id) for c in claims], lease_seconds=300)
    assert set(renewed) == {claims[0].job_id, claims[2].job_id}
    assert all(renewed[c.job_id] > c.lease_expires_at for c in (claims[0], claims[2]))
    # A row naming a job with another job's attempt matches nothing.
    assert store.attempts.heartbeat_many(
        [(claims[0].job_id, claims[2].attempt_id)], lease_seconds=300) == {}


def test_finish_many_writes_the_rows_whose_fence_holds_and_claims_with_them(
        store: Store) -> None:
    first = [enqueue_one(store) for _ in range(3)]
    claims = store.attempts.claim(worker_id="w", lease_seconds=60, limit=3)
    later = [enqueue_one(store) for _ in range(2)]
    store.jobs.cancel(job_id=claims[0].job_id)
    outcome = ActionOutcome(index=0, name="sleep", succeeded=True, started_at=NOW,
                            result={"slept_seconds": 0})
    writes = [TerminalWrite(c.job_id, c.attempt_id, True, outcome) for c in claims]
    written, nxt = store.attempts.finish_many(
        writes, claim=ClaimRequest("w", 60, "default", 5))
    assert written == {claims[1].job_id, claims[2].job_id}
    assert sorted(c.job_id for c in nxt) == sorted(later)
    assert len({c.attempt_id for c in nxt} | {c.attempt_id for c in claims}) == 5
    for c in claims[1:]:
        assert terminal_events(store, c.job_id) == ["succeeded"]
    assert terminal_events(store, claims[0].job_id) == ["cancelled"]
    results = store.jobs.action_results(first)
    assert {r.job_id for r in results} == {claims[1].job_id, claims[2].job_id}
    assert all(r.result == {"slept_seconds": 0} for r in results)
    # The spent fences match nothing again; the claim still rides (nothing is ready).
    again, more = store.attempts.finish_many(
        writes, claim=ClaimRequest("w", 60, "default", 5))
    assert again == set() and more == []


@pytest.mark.parametrize("succeeded", [True, False])
def test_a_batch_of_one_is_written_as_a_batch_is(store: Store, succeeded: bool) -> None:
    """A worker running one job at a time sends each terminal write alone (the single-row
    statement): the same fence, outcome, reason, error and audit as in a batch."""
    [a, b] = [enqueue_one(store) for _ in range(2)]
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60, limit=1)
    outcome = ActionOutcome(index=0, name="sleep", succeeded=succeeded, started_at=NOW,
                            result={"slept_seconds": 0}, error=None if succeeded else "boom")
    write = TerminalWrite(claim.job_id, claim.attempt_id, succeeded, outcome,
                          error=None if succeeded else "boom")
    stale = TerminalWrite(claim.job_id, (b if claim.job_id == a else a), succeeded, outcome)
    assert store.attempts.finish_many([stale]) == (set(), [])  # another's id: no match
    written, nxt = store.attempts.finish_many(
        [write], claim=ClaimRequest("w", 60, "default", 1))
    assert written == {claim.job_id}
    assert [c.job_id for c in nxt] == [b if claim.job_id == a else a]
    assert nxt[0].attempt_id != claim.attempt_id
    status = "succeeded" if succeeded else "failed"
    assert terminal_events(store, claim.job_id) == [status]
    [row] = store.jobs.action_results([claim.job_id])
    assert (row.status, row.result) == (status, {"slept_seconds": 0})
    again, more = store.attempts.finish_many([write])
    assert again == set() and more == []
    assert terminal_events(store, claim.job_id) == [status]


def test_interrupt_many_gives_back_each_row_on_its_own_fence(store: Store) -> None:
    jobs = [enqueue_one(store) for _ in range(3)]
    claims = store.attempts.claim(worker_id="w", lease_seconds=60, limit=3)
    store.jobs.cancel(job_id=claims[2].job_id)
    back = store.attempts.interrupt_many([(c.job_id, c.attempt_id) for c in claims],
                                         reason="worker received SIGTERM",
                                         max_interruptions=10)
    assert {t.job_id for t in back} == {claims[0].job_id, claims[1].job_id}
    assert all(t.status == "pending" for t in back)
    for j in jobs[:2]:
        row = store.jobs.get(j)
        assert row is not None and row.attempt_count == 0 and row.attempt_id is None


def test_a_batch_is_bounded(store: Store) -> None:
    from jobfence.errors import JobfenceError
    from jobfence.ids import uuid7

    too_many = [(uuid7(), uuid7()) for _ in range(1001)]
    with pytest.raises(JobfenceError, match="at most 1000"):
        store.attempts.heartbeat_many(too_many, lease_seconds=30)


def test_the_batched_writes_carry_the_fence_per_row_as_installed(conn: Connection) -> None:
    """Each batch verb matches every row on its own attempt and a live lease, checked
    against the clock of the moment the row is checked."""
    bodies = {r["proname"]: r["prosrc"] for r in conn.execute(
        "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = "
        "p.pronamespace WHERE n.nspname = 'jobfence' AND p.proname LIKE 'worker_%%_many'")}
    assert set(bodies) == {"worker_heartbeat_many", "worker_finish_many",
                           "worker_interrupt_many"}
    for name, body in bodies.items():
        assert re.search(r"j\.job_id = (a|g)\.job_id AND j\.attempt_id = (a|g)\.attempt_id",
                         body), name
        assert "visible_at > clock_timestamp()" in body, name


# -- races, run as races -------------------------------------------------------------------


def test_batched_claims_racing_take_each_job_once(dsn: str, store: Store) -> None:
    ids = {enqueue_one(store) for _ in range(120)}
    results = race(dsn, lambda s: s.attempts.claim(worker_id="racer", lease_seconds=30,
                                                   limit=10))
    claimed = [c.job_id for r in results for c in r]
    assert sorted(claimed) == sorted(ids) and len(claimed) == 120 < THREADS * 10
    assert len({c.attempt_id for r in results for c in r}) == 120


def test_batched_terminal_writes_racing_with_cancels_end_each_job_once(
        dsn: str, store: Store) -> None:
    """Batches that repeat one another's rows, and cancels, all at once: every job ends
    exactly once, each either by its batch (its fence held) or by its cancel."""
    for _ in range(40):
        enqueue_one(store)
    claims = store.attempts.claim(worker_id="w", lease_seconds=60, limit=40)
    writes = [TerminalWrite(c.job_id, c.attempt_id, True) for c in claims]
    turn = iter(range(10**6))
    lock = __import__("threading").Lock()

    def one(s: Store) -> Any:
        with lock:
            i = next(turn)
        if i % 5 == 0:  # a cancel of one job
            return s.jobs.cancel(job_id=claims[i % 40].job_id, reason="operator")
        return s.attempts.finish_many(writes[i % 7:] + writes[: i % 7])[0]

    results = race(dsn, one)
    written: set[Any] = set().union(*(r for r in results if isinstance(r, set)))
    for c in claims:
        ends = terminal_events(store, c.job_id)
        assert len(ends) == 1, (c.job_id, ends)
        assert (ends == ["succeeded"]) == (c.job_id in written)
