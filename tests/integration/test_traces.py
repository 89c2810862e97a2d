"""The trace context on the real store: the enqueue's traceparent kept with each job (a
datum's children carry their parent's), refused by the database when it is not a
traceparent, and read back by a worker only for the attempt holding the fence, as the
worker role and nothing more (worker_trace)."""

from __future__ import annotations

from uuid import uuid4

import psycopg
import pytest
from psycopg.rows import dict_row

from devtools.roles import ensure_logins
from jobfence.settings import load_settings
from jobfence.spec import parse_specs
from jobfence.store import RetryPolicy, Store
from jobfence.submit import submit
from jobfence.tracecontext import attempt_span_id
from tests.support import Dsn
from tests.support.factories import enqueue_one, make_parent

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
NOW = RetryPolicy(0, 0)


def traceparent_of(store: Store, job_id: object) -> str | None:
    row = store.conn.execute("SELECT traceparent FROM jobfence.jobs WHERE job_id = %s",
                             (job_id,)).fetchone()
    assert row is not None
    return row["traceparent"]  # type: ignore[no-any-return,call-overload]


def test_the_traceparent_is_kept_and_a_datums_children_carry_their_parents(
        store: Store) -> None:
    plain = enqueue_one(store)
    traced = enqueue_one(store, traceparent=TP)
    parent, kids = make_parent(store, 3, traceparent=TP)
    assert traceparent_of(store, plain) is None
    assert traceparent_of(store, traced) == TP
    assert [traceparent_of(store, k) for k in (parent, *kids)] == [TP] * 4


def test_a_callers_traceparent_is_kept_when_this_process_does_not_trace(
        store: Store, dsn: Dsn) -> None:
    """The HTTP API's and the CLI's caller: a valid traceparent is stored (in its version
    00 form), an invalid one is ignored, as the W3C specification says a receiver does."""
    settings = load_settings(database_url=str(dsn), tracing="off")
    spec = parse_specs({"actions": [{"name": "sleep", "params": {"seconds": 0}}]})
    given = {
        TP: TP,
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more": TP,  # a later version
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01": None,  # upper case
        "00-00000000000000000000000000000000-b7ad6b7169203331-01": None,
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01": None,
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x": None,
        "'; DROP TABLE jobs; --": None,
    }
    for header, stored in given.items():
        [made] = submit(settings, store, spec, traceparent=header)
        assert traceparent_of(store, made.job_id) == stored, header


def test_the_database_refuses_what_is_not_a_traceparent(store: Store) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        store.conn.execute("INSERT INTO jobfence.jobs (job_id, status, actions, max_attempts, "
                           "traceparent) VALUES (gen_random_uuid(), 'pending', '[]', 3, "
                           "'not a traceparent')")


def test_only_the_attempt_holding_the_fence_reads_its_trace_and_a_retry_names_the_first(
        store: Store) -> None:
    job = enqueue_one(store, traceparent=TP)
    [first] = store.attempts.claim(worker_id="w", lease_seconds=300)
    mine = attempt_span_id(first.attempt_id)  # the database derives it as the worker does
    assert store.traces.for_attempt(job, first.attempt_id) == (TP, mine)
    assert store.traces.for_attempt(job, uuid4()) is None
    assert store.traces.for_attempt(uuid4(), first.attempt_id) is None
    assert store.attempts.release(job_id=job, attempt_id=first.attempt_id, reason="again",
                                  retry=NOW) is not None
    assert store.traces.for_attempt(job, first.attempt_id) is None  # no longer holds
    [second] = store.attempts.claim(worker_id="w", lease_seconds=300)
    assert second.job_id == job and second.attempt_id != first.attempt_id
    assert store.traces.for_attempt(job, second.attempt_id) == (TP, mine)


def test_the_worker_role_reads_a_trace_through_its_function_only(store: Store,
                                                                 dsn: Dsn) -> None:
    job = enqueue_one(store, traceparent=TP)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=300)
    worker = ensure_logins(dsn.direct)["worker"]
    with psycopg.connect(worker, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute("SELECT * FROM jobfence.worker_trace(%s, %s)",
                            (job, claim.attempt_id)).fetchall()
        assert rows == [{"traceparent": TP,
                         "first_span_id": f"{attempt_span_id(claim.attempt_id):016x}"}]
        assert conn.execute("SELECT * FROM jobfence.worker_trace(%s, NULL)",
                            (job,)).fetchall() == []
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT traceparent FROM jobfence.jobs")
