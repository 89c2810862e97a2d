"""Audit: every transition appends an event in the same transaction; if the event cannot be
written, the transition does not happen either."""

from __future__ import annotations

import psycopg
import pytest

from jobfence.errors import Drained, IdempotencyConflict, JobNotFound, StoreError
from jobfence.ids import uuid7
from jobfence.store import Store
from tests.support.factories import enqueue_one, new_job

pytestmark = pytest.mark.pooled  # directly and through PgBouncer


def test_every_transition_has_an_event(store: Store) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True)
    events = store.jobs.events(job_id)
    assert [(e.from_status, e.to_status) for e in events] == [
        (None, "pending"), ("pending", "running"), ("running", "succeeded")]
    assert events[1].attempt_id == claim.attempt_id == events[2].attempt_id
    assert events[1].reason == "claimed by w"


def test_heartbeat_is_not_a_transition(store: Store) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    for _ in range(3):
        store.attempts.heartbeat(job_id=job_id, attempt_id=claim.attempt_id, lease_seconds=30)
    assert len(store.jobs.events(job_id)) == 2


def test_transition_rolls_back_when_its_event_fails(store: Store) -> None:
    job_id = enqueue_one(store)
    store.conn.execute("""
        CREATE FUNCTION refuse_event() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'audit write refused'; END $$;
        CREATE TRIGGER refuse_event BEFORE INSERT ON job_events
            FOR EACH ROW EXECUTE FUNCTION refuse_event();
    """)
    with pytest.raises(StoreError, match="audit write refused") as raised:
        store.attempts.claim(worker_id="w", lease_seconds=30)
    assert isinstance(raised.value.__cause__, psycopg.errors.RaiseException)
    with pytest.raises(StoreError, match="audit write refused"):
        store.jobs.enqueue([new_job()])
    store.conn.execute("DROP TRIGGER refuse_event ON job_events")
    row = store.jobs.get(job_id)
    assert row is not None and row.status == "pending" and row.attempt_count == 0
    assert len(store.jobs.page()) == 1  # the second enqueue left nothing behind
    assert len(store.jobs.events(job_id)) == 1


def test_drain_refuses_enqueue_and_claims_nothing(store: Store) -> None:
    enqueue_one(store)
    store.control.set_drain(on=True, reason="upgrade")
    with pytest.raises(Drained):
        store.jobs.enqueue([new_job()])
    assert store.attempts.claim(worker_id="w", lease_seconds=30) == []
    state = store.control.drain_status()
    assert state.draining and state.drain_reason == "upgrade"
    store.control.set_drain(on=False)
    assert len(store.attempts.claim(worker_id="w", lease_seconds=30)) == 1
    assert store.control.running_count() == 1


def test_bulk_enqueue_is_all_or_nothing(store: Store) -> None:
    enqueue_one(store, resource="busy")
    from jobfence.errors import ResourceBusy

    with pytest.raises(ResourceBusy):
        store.jobs.enqueue([new_job(), new_job(resource="busy"), new_job()])
    assert len(store.jobs.page()) == 1


def test_idempotency_key_returns_same_job_or_conflicts(store: Store) -> None:
    [first] = store.jobs.enqueue([new_job(idempotency_key="k", spec_hash="a")])
    [again] = store.jobs.enqueue([new_job(idempotency_key="k", spec_hash="a")])
    assert again.job_id == first.job_id and not again.created
    with pytest.raises(IdempotencyConflict):
        store.jobs.enqueue([new_job(idempotency_key="k", spec_hash="b")])
    assert len(store.jobs.page()) == 1


def test_after_unknown_job_is_not_found_and_writes_nothing(store: Store) -> None:
    with pytest.raises(JobNotFound):
        store.jobs.enqueue([new_job(after=(uuid7(),))])
    assert store.jobs.page() == []


def test_after_resolves_on_dependency_terminal_write(store: Store) -> None:
    a = enqueue_one(store)
    [b] = store.jobs.enqueue([new_job(after=(a,))])
    assert b.status == "waiting"
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    assert claim.job_id == a
    store.attempts.finish(job_id=a, attempt_id=claim.attempt_id, succeeded=True)
    assert store.jobs.get(b.job_id).status == "pending"  # type: ignore[index]


def test_after_an_already_succeeded_job_is_pending_at_once(store: Store) -> None:
    a = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    store.attempts.finish(job_id=a, attempt_id=claim.attempt_id, succeeded=True)
    [b] = store.jobs.enqueue([new_job(after=(a,))])
    assert b.status == "pending"
