"""Bulk retry and cancel on the real store: 10,000 failed jobs retried in batches, each
audited once with the caller and no transaction writing more than a batch; a dry run writes
nothing; every refusal of the one-job verbs holds job by job (still stopping, a child of a
finished parent, a parent, a resource held by another job); a cancel takes a parent's
children with it; a retry racing a cancel of the same selection leaves every job audited
once per change."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from jobfence import bulk, db
from jobfence.errors import Drained
from jobfence.store import Store
from tests.support import Dsn
from tests.support.factories import enqueue_one, new_job

pytestmark = pytest.mark.pooled


def fail(store: Store, ids: list[UUID], status: str = "failed") -> None:
    """Jobs as their worker would have ended them (set directly, as the owner may)."""
    store.conn.execute("UPDATE jobfence.jobs SET status = %s, finished_at = now(), "
                       "error = 'boom' WHERE job_id = ANY(%s)", (status, ids))


def many(store: Store, n: int, **kw: Any) -> list[UUID]:
    jobs = [new_job(**kw) for _ in range(n)]
    for i in range(0, n, 5000):
        store.jobs.enqueue(jobs[i:i + 5000])
    return [j.job_id for j in jobs]


def retry(store: Store, **kw: Any) -> bulk.Outcome:
    kw.setdefault("limit", bulk.MAX_LIMIT)
    kw.setdefault("batch", 500)
    sel = kw.pop("sel", bulk.Selection(statuses=("failed",)))
    return bulk.act(store, "retry", sel, reason="retried by alice (bulk): nightly", **kw)


def test_ten_thousand_failed_jobs_each_audited_once_in_batches(store: Store,
                                                                conn: db.Connection) -> None:
    ids = many(store, 10_000)
    fail(store, ids)
    before = conn.execute("SELECT count(*) AS n FROM jobs").fetchone()
    dry = retry(store, dry_run=True)
    assert (dry.matched, dry.done, len(dry.job_ids)) == (10_000, 0, 10_000)
    assert conn.execute("SELECT count(*) AS n FROM job_events WHERE reason LIKE "
                        "'retried by%%'").fetchone() == {"n": 0}
    out = retry(store)
    assert (out.matched, out.done, dict(out.refused), out.batches) == (10_000, 10_000, {}, 20)
    events = conn.execute("SELECT job_id, count(*) AS n FROM job_events "
                          "WHERE reason = 'retried by alice (bulk): nightly' "
                          "GROUP BY job_id").fetchall()
    assert len(events) == 10_000 and {e["n"] for e in events} == {1}
    # Each transaction (the events' xmin) wrote one batch at most.
    per_xact = conn.execute("SELECT xmin::text, count(*) AS n FROM job_events "
                            "WHERE reason LIKE 'retried by%%' GROUP BY 1").fetchall()
    assert len(per_xact) == 20 and max(r["n"] for r in per_xact) == 500
    assert conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'pending'"
                        ).fetchone() == {"n": 10_000}
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone() == before


def test_filters_and_a_time_window(store: Store) -> None:
    old = many(store, 3, queue="reports", labels={"team": "a"})
    cutoff = datetime.now(UTC)
    new = many(store, 4, queue="reports", labels={"team": "a"})
    other = many(store, 2, queue="default", labels={"team": "a"})
    fail(store, old + new + other)
    sel = bulk.Selection(statuses=("failed",), queue="reports", labels={"team": "a"},
                         created_after=cutoff)
    out = retry(store, sel=sel)
    assert out.done == 4
    assert {store.jobs.get(j).status for j in new} == {"pending"}  # type: ignore[union-attr]
    assert {store.jobs.get(j).status for j in old + other} == {"failed"}  # type: ignore[union-attr]
    assert retry(store, limit=2).done == 2  # newest first, at most the limit


def test_each_refusal_of_retry_holds_job_by_job(store: Store) -> None:
    ok = enqueue_one(store)
    busy = enqueue_one(store, resource="db.events")
    fail(store, [ok, busy])
    enqueue_one(store, resource="db.events")  # holds the resource now
    stopping = enqueue_one(store)
    store.conn.execute("UPDATE jobfence.jobs SET status = 'cancelled', finished_at = now(), "
                       "stopping_attempt_id = gen_random_uuid(), "
                       "stopping_until = now() + interval '1 hour' WHERE job_id = %s",
                       (stopping,))
    parent = enqueue_one(store, is_parent=True)
    store.conn.execute("UPDATE jobfence.jobs SET status = 'failed', finished_at = now() "
                       "WHERE job_id = %s", (parent,))
    child = enqueue_one(store, parent_id=parent, waiting=True)
    fail(store, [child])
    out = retry(store, sel=bulk.Selection(statuses=("failed", "cancelled")))
    assert out.done == 1
    assert dict(out.refused) == {"resource_busy": 1, "stopping": 1, "parent": 1,
                                 "parent_not_running": 1}
    assert store.jobs.get(ok).status == "pending"  # type: ignore[union-attr]
    assert store.jobs.get(busy).status == "failed"  # type: ignore[union-attr]


def test_explicit_ids_answer_not_found_for_a_missing_one(store: Store) -> None:
    a = enqueue_one(store)
    fail(store, [a])
    ghost = new_job().job_id
    out = retry(store, sel=bulk.Selection(job_ids=(a, ghost)))
    assert out.done == 1 and dict(out.refused) == {"not_found": 1}


def test_cancel_takes_children_and_refuses_the_finished(store: Store) -> None:
    parent = enqueue_one(store, is_parent=True)
    children = [enqueue_one(store, parent_id=parent) for _ in range(3)]
    done = enqueue_one(store)
    fail(store, [done], "succeeded")
    out = bulk.act(store, "cancel", bulk.Selection(job_ids=(parent, done)),
                   reason="cancelled by bob (bulk)", limit=10, batch=500)
    assert (out.done, out.children_cancelled, dict(out.refused)) == (1, 3, {"finished": 1})
    assert {store.jobs.get(c).status for c in children} == {"cancelled"}  # type: ignore[union-attr]


def test_retry_is_refused_while_draining(store: Store) -> None:
    fail(store, [enqueue_one(store)])
    store.control.set_drain(on=True, reason="x", actor="t")
    with pytest.raises(Drained):
        retry(store)


def test_a_bulk_cancel_racing_a_bulk_retry_changes_each_job_once_each(dsn: Dsn) -> None:
    """Two operators at once over the same jobs: every job ends either retried then
    cancelled, or cancelled (if it was pending) — never changed twice by one verb."""
    with db.connect(dsn, pooler=dsn.pooler) as c:
        store = Store(c)
        ids = many(store, 600)
        fail(store, ids[:300])
    start = threading.Barrier(2)
    outcomes: dict[str, bulk.Outcome] = {}

    def go(verb: str, statuses: tuple[str, ...]) -> None:
        with db.connect(dsn, pooler=dsn.pooler) as c:
            start.wait()
            outcomes[verb] = bulk.act(Store(c), verb, bulk.Selection(statuses=statuses),
                                      reason=f"{verb} (bulk)", limit=10_000, batch=50)

    threads = [threading.Thread(target=go, args=("retry", ("failed",))),
               threading.Thread(target=go, args=("cancel", ("pending",)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes["retry"].done == 300
    with db.connect(dsn.direct) as c:
        rows = c.execute("SELECT job_id, count(*) FILTER (WHERE reason = 'retry (bulk)') AS r, "
                         "count(*) FILTER (WHERE reason = 'cancel (bulk)') AS k "
                         "FROM jobfence.job_events GROUP BY job_id").fetchall()
    assert all(r["r"] <= 1 and r["k"] <= 1 for r in rows)
    assert sum(r["k"] for r in rows) == outcomes["cancel"].done


def test_times_parse_or_are_refused() -> None:
    assert bulk.parse_time("2026-11-24T18:00:00Z", "--after") == datetime(
        2026, 11, 24, 18, tzinfo=UTC)
    ago = datetime.now(UTC) - bulk.parse_time("PT12H", "--after")
    assert timedelta(hours=11, minutes=59) < ago < timedelta(hours=12, minutes=1)
    for bad in ("yesterday", "2026-13-01T00:00:00Z", "P", "1700000000", "PT-1H"):
        with pytest.raises(Exception, match="--after"):
            bulk.parse_time(bad, "--after")
