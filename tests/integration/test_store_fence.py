"""The fence: after a claim, every write is predicated on (job_id, attempt_id) and a live
lease; cancel and reclaim rotate it, so a stale attempt's writes match nothing."""

from __future__ import annotations

import datetime as dt

import pytest

from jobfence.errors import JobAlreadyTerminal, JobNotFound
from jobfence.ids import uuid7
from jobfence.store import IMMEDIATE, ActionOutcome, RetryPolicy, Store
from tests.support.factories import enqueue_one

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

NOW = dt.datetime.now(dt.UTC)
OUTCOME = ActionOutcome(index=0, name="sleep", succeeded=True, started_at=NOW)


def stale_writes_match_nothing(store: Store, job_id, attempt_id) -> None:  # type: ignore[no-untyped-def]
    assert store.attempts.heartbeat(job_id=job_id, attempt_id=attempt_id, lease_seconds=60) is None
    assert not store.attempts.record_action(job_id=job_id, attempt_id=attempt_id, outcome=OUTCOME)
    assert store.attempts.finish(job_id=job_id, attempt_id=attempt_id, succeeded=True) is None
    assert store.attempts.release(job_id=job_id, attempt_id=attempt_id, reason="x",
                         retry=IMMEDIATE) is None


def terminal_events(store: Store, job_id) -> list:  # type: ignore[no-untyped-def]
    return [e for e in store.jobs.events(job_id)
            if e.to_status in ("succeeded", "failed", "cancelled")]


def test_claim_gives_fresh_fence_and_lease(store: Store) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w1", lease_seconds=30)
    assert claim.job_id == job_id
    assert claim.attempt_count == 1
    row = store.jobs.get(job_id)
    assert row is not None
    assert row.status == "running" and row.attempt_id == claim.attempt_id
    assert row.claimed_by == "w1"
    assert 25 < (row.visible_at - row.claimed_at).total_seconds() <= 30
    assert store.attempts.claim(worker_id="w2", lease_seconds=30) == []


def test_heartbeat_extends_lease_for_holder(store: Store) -> None:
    enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w1", lease_seconds=5)
    renewed = store.attempts.heartbeat(job_id=claim.job_id, attempt_id=claim.attempt_id,
                              lease_seconds=300)
    assert renewed is not None and renewed > claim.lease_expires_at


def test_finish_with_stale_attempt_after_cancel_matches_no_row(store: Store) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w1", lease_seconds=30)
    store.jobs.cancel(job_id=job_id, reason="operator")
    stale_writes_match_nothing(store, job_id, claim.attempt_id)
    row = store.jobs.get(job_id)
    assert row is not None and row.status == "cancelled" and row.attempt_id is None
    assert len(terminal_events(store, job_id)) == 1


def test_writes_after_reclaim_match_nothing_and_new_attempt_wins(store: Store) -> None:
    job_id = enqueue_one(store)
    [old] = store.attempts.claim(worker_id="w1", lease_seconds=30)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=31)
    [reclaimed] = store.maintenance.reclaim_expired(retry=IMMEDIATE, batch_size=10, now=later)
    assert (reclaimed.job_id, reclaimed.status) == (job_id, "pending")
    stale_writes_match_nothing(store, job_id, old.attempt_id)
    [new] = store.attempts.claim(worker_id="w2", lease_seconds=30)
    assert new.attempt_id != old.attempt_id and new.attempt_count == 2
    stale_writes_match_nothing(store, job_id, old.attempt_id)
    assert store.attempts.finish(job_id=job_id, attempt_id=new.attempt_id,
                                 succeeded=True) is not None
    stale_writes_match_nothing(store, job_id, old.attempt_id)
    stale_writes_match_nothing(store, job_id, new.attempt_id)
    assert len(terminal_events(store, job_id)) == 1


def test_writes_after_lease_ran_out_match_nothing_even_before_reclaim(
        store: Store) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w1", lease_seconds=0.2)
    import time

    time.sleep(0.3)
    stale_writes_match_nothing(store, job_id, claim.attempt_id)
    assert store.jobs.get(job_id).status == "running"  # type: ignore[index]


def test_unexpired_lease_is_not_reclaimed(store: Store) -> None:
    enqueue_one(store)
    store.attempts.claim(worker_id="w1", lease_seconds=60)
    assert store.maintenance.reclaim_expired(retry=IMMEDIATE, batch_size=10) == []


def test_finish_is_terminal_exactly_once(store: Store) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w1", lease_seconds=30)
    assert store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True)
    assert store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id,
                                 succeeded=False) is None
    with pytest.raises(JobAlreadyTerminal):
        store.jobs.cancel(job_id=job_id)
    assert [e.to_status for e in terminal_events(store, job_id)] == ["succeeded"]
    row = store.jobs.get(job_id)
    assert row is not None and row.attempt_id == claim.attempt_id


def test_release_retries_with_delay_then_fails_when_attempts_exhausted(
        store: Store) -> None:
    job_id = enqueue_one(store, max_attempts=2)
    [a1] = store.attempts.claim(worker_id="w", lease_seconds=30)
    t = store.attempts.release(job_id=job_id, attempt_id=a1.attempt_id, reason="boom",
                      retry=RetryPolicy(100, 100), error="boom")
    assert t is not None and t.status == "pending"
    row = store.jobs.get(job_id)
    assert row is not None
    delay = (row.visible_at - dt.datetime.now(dt.UTC)).total_seconds()
    assert 40 < delay <= 100  # equal jitter: between half and all of the delay
    assert store.attempts.claim(worker_id="w", lease_seconds=30) == []  # not visible yet
    store.conn.execute("UPDATE jobs SET visible_at = now() WHERE job_id = %s", (job_id,))
    [a2] = store.attempts.claim(worker_id="w", lease_seconds=30)
    assert a2.attempt_count == 2
    t = store.attempts.release(job_id=job_id, attempt_id=a2.attempt_id, reason="boom again",
                      retry=IMMEDIATE, error="boom again")
    assert t is not None and t.status == "failed"
    row = store.jobs.get(job_id)
    assert row is not None and row.error == "boom again" and row.attempt_count == 2


def test_attempt_count_never_exceeds_max_attempts(store: Store) -> None:
    job_id = enqueue_one(store, max_attempts=3)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    for _ in range(5):
        store.attempts.claim(worker_id="w", lease_seconds=1)
        store.maintenance.reclaim_expired(retry=IMMEDIATE, batch_size=10, now=later)
    row = store.jobs.get(job_id)
    assert row is not None and row.status == "failed" and row.attempt_count == 3
    # Even a hand-written UPDATE cannot break the bound: the database refuses it.
    import psycopg

    with pytest.raises(psycopg.errors.CheckViolation):
        store.conn.execute("UPDATE jobs SET attempt_count = 4 WHERE job_id = %s", (job_id,))


def test_cancel_pending_and_unknown(store: Store) -> None:
    job_id = enqueue_one(store)
    [t] = store.jobs.cancel(job_id=job_id, reason="no longer needed")
    assert t.status == "cancelled"
    with pytest.raises(JobNotFound):
        store.jobs.cancel(job_id=uuid7())


def test_claim_prefers_priority_then_age(store: Store) -> None:
    low = enqueue_one(store, priority=0)
    high = enqueue_one(store, priority=5)
    low2 = enqueue_one(store, priority=0)
    order = [store.attempts.claim(worker_id="w", lease_seconds=30)[0].job_id for _ in range(3)]
    assert order == [high, low, low2]


def test_claim_batch_gives_each_job_its_own_fence(store: Store) -> None:
    for _ in range(5):
        enqueue_one(store)
    claims = store.attempts.claim(worker_id="w", lease_seconds=30, limit=3)
    assert len(claims) == 3 and len({c.attempt_id for c in claims}) == 3


def test_reclaim_is_bounded_by_batch_size(store: Store) -> None:
    for _ in range(7):
        enqueue_one(store)
    store.attempts.claim(worker_id="w", lease_seconds=1, limit=7)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=10)
    assert len(store.maintenance.reclaim_expired(retry=IMMEDIATE, batch_size=3, now=later)) == 3
    assert len(store.maintenance.reclaim_expired(retry=IMMEDIATE, batch_size=3, now=later)) == 3
    assert len(store.maintenance.reclaim_expired(retry=IMMEDIATE, batch_size=3, now=later)) == 1


def test_action_record_is_idempotent_and_finish_carries_the_last_one(
        store: Store) -> None:
    job_id = enqueue_one(store, actions=[{"name": "sleep", "params": {"seconds": 0}}] * 2)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    assert store.attempts.record_action(job_id=job_id, attempt_id=claim.attempt_id, outcome=OUTCOME)
    assert store.attempts.record_action(job_id=job_id, attempt_id=claim.attempt_id, outcome=OUTCOME)
    last = ActionOutcome(index=1, name="sleep", succeeded=True, started_at=NOW,
                         result={"ok": 1})
    assert store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True,
                        outcome=last)
    assert {r.action_index for r in store.jobs.action_results([job_id])
            if r.status == "succeeded"} == {0, 1}


def test_stale_finish_leaves_no_action_record_behind(store: Store) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    store.jobs.cancel(job_id=job_id)
    assert store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True,
                        outcome=OUTCOME) is None
    assert store.jobs.action_results([job_id]) == []
