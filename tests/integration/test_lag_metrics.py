"""How long the periodic passes take and how late what came due is done (migration 0020), on
the real store: each run's duration lands in its function's histogram (0.1 s to 120 s) and
runs recorded from two connections add up; lifecycle records how late it enforced each run
timeout, expiry and retention after it came due, measured by the pass's own notion of now;
a parent's finalization records how long after its last child it came, once however many
finalizers race, whoever finalizes it, and never for a cancelled parent; the overdue gauge
says how long the oldest deadline lifecycle has not enforced yet has been due."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from prometheus_client.parser import text_string_to_metric_families

import jobfence.passes.export_finalize as export_finalize
import jobfence.passes.lifecycle as lifecycle
from devtools.memory_objects import MemoryObjectStore
from devtools.sqlconn import connect
from jobfence import metrics
from jobfence.finalize import finalize_parent
from jobfence.ids import uuid7
from jobfence.passes.harness import Deps
from jobfence.settings import load_settings
from jobfence.store import Store
from tests.support.factories import enqueue_one, installation, make_parent

Sample = tuple[str, tuple[tuple[str, str], ...]]


def samples(store: Store, **kw: Any) -> dict[Sample, float]:
    """The exposition, parsed by the Prometheus client's own parser."""
    text = metrics.exposition(store, **kw)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def lag(store: Store, name: str, queue: str = "default", label: str = "") -> dict[float, float]:
    """A lag histogram's per-bucket counts (and its sum under the key -1), after a fold."""
    store.job_metrics.fold()
    out = {}
    for t in store.job_metrics.totals():
        if (t.queue, t.label) == (queue, label) and t.name in (name, f"{name}_sum"):
            out[-1.0 if t.name.endswith("_sum") else t.le] = t.value
    return out


def ran(store: Store, function: str, seconds: float, status: str = "succeeded") -> None:
    """A run of ``function`` that took ``seconds``, as a pass records it."""
    holder = uuid7()
    run_id = store.runs.run_started(function=function, trigger="scheduled", holder=holder,
                                    lease_seconds=60)
    assert run_id is not None
    store.runs.run_finished(run_id=run_id, function=function, trigger="scheduled",
                            status=status, counts={}, duration_seconds=seconds)
    store.runs.lease_release(function=function, holder=holder)


def sql(store: Store, statement: str, *args: object) -> None:
    store.conn.execute(statement, args)  # type: ignore[arg-type]


def run_lifecycle(store: Store, dsn: str, **kw: Any) -> lifecycle.Report:
    s = load_settings(database_url=dsn, retry_base_seconds=0)
    return lifecycle.run_once(s, Deps(store, s, **kw))


# -- pass durations --------------------------------------------------------------------------

def test_pass_durations_are_one_histogram_across_pods(store: Store, dsn: str) -> None:
    other = Store(connect(dsn))  # another pod's connection
    try:
        ran(store, "lifecycle", 0.05)
        ran(other, "lifecycle", 3.0)
        ran(store, "lifecycle", 45.0, status="failed")
        ran(other, "lifecycle", 200.0, status="interrupted")
        ran(store, "sweeper", 0.3)
        holder = uuid7()  # a run in progress: the next one is skipped, and takes no time
        assert store.runs.run_started(function="sweeper", trigger="manual", holder=holder,
                                      lease_seconds=60) is not None
        assert other.runs.run_started(function="sweeper", trigger="manual", holder=uuid7(),
                                      lease_seconds=60) is None
    finally:
        other.conn.close()
    got = samples(store)
    bucket = "jobfence_function_duration_seconds_bucket"
    assert {le: got[(bucket, (("function", "lifecycle"), ("le", le)))]
            for le in ("0.1", "0.5", "5.0", "30.0", "60.0", "120.0", "+Inf")} == {
        "0.1": 1, "0.5": 1, "5.0": 2, "30.0": 2, "60.0": 3, "120.0": 3, "+Inf": 4}
    assert got[("jobfence_function_duration_seconds_count", (("function", "lifecycle"),))] == 4
    assert got[("jobfence_function_duration_seconds_sum", (("function", "lifecycle"),))] \
        == pytest.approx(248.05)
    assert got[("jobfence_function_duration_seconds_count", (("function", "sweeper"),))] == 1
    assert got[(bucket, (("function", "sweeper"), ("le", "0.5")))] == 1
    # The histogram is not also shown as counted items.
    assert not [k for k in got if k[0] == "jobfence_function_items_total"
                and dict(k[1])["item"].startswith("duration")]


# -- lifecycle's lateness --------------------------------------------------------------------

def test_lifecycle_records_how_late_it_enforced_each_kind_of_deadline(
        store: Store, dsn: str) -> None:
    timed_out = enqueue_one(store, timeout_seconds=3600)
    store.attempts.claim(worker_id="w", lease_seconds=600)
    sql(store, "UPDATE jobs SET run_deadline_at = now() - interval '40 seconds' "
               "WHERE job_id = %s", timed_out)
    expired = enqueue_one(store, queue="reports", expires_in_seconds=3600)
    sql(store, "UPDATE jobs SET expires_at = now() - interval '7 seconds' WHERE job_id = %s",
        expired)
    kept = enqueue_one(store, ttl_seconds=3600)  # retention by its ttl, 90 s late
    by_default = enqueue_one(store)  # no ttl: the default retention (P30D), 2 h late
    for _ in range(2):
        [c] = store.attempts.claim(worker_id="w", lease_seconds=600)
        assert store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True)
    sql(store, "UPDATE jobs SET retain_until = now() - interval '90 seconds' WHERE job_id = %s",
        kept)
    sql(store, "UPDATE jobs SET finished_at = now() - interval '30 days 2 hours' "
               "WHERE job_id = %s", by_default)
    report = run_lifecycle(store, dsn)
    assert (report.timed_out_retried, report.expired_cancelled) == (1, 1)
    assert report.retention_jobs_deleted == 2
    timeout = lag(store, "lifecycle_lag", label="timeout")
    assert timeout[60.0] == 1 and 40 <= timeout[-1] < 45
    expiry = lag(store, "lifecycle_lag", queue="reports", label="expiry")
    assert expiry[10.0] == 1 and 7 <= expiry[-1] < 10
    retention = lag(store, "lifecycle_lag", label="retention")
    assert (retention[120.0], retention[21600.0]) == (1, 1)
    assert 7290 <= retention[-1] < 7300
    got = samples(store)
    name = "jobfence_lifecycle_lag_seconds_bucket"
    assert got[(name, (("kind", "timeout"), ("le", "30.0"), ("queue", "default")))] == 0
    assert got[(name, (("kind", "timeout"), ("le", "60.0"), ("queue", "default")))] == 1
    assert got[(name, (("kind", "retention"), ("le", "+Inf"), ("queue", "default")))] == 2
    assert got[("jobfence_lifecycle_lag_seconds_count",
                (("kind", "expiry"), ("queue", "reports")))] == 1
    # A second pass finds nothing due and records nothing.
    run_lifecycle(store, dsn)
    assert lag(store, "lifecycle_lag", label="timeout")[60.0] == 1


def test_lateness_is_measured_by_the_passs_own_now(store: Store, dsn: str) -> None:
    enqueue_one(store, timeout_seconds=60)
    [c] = store.attempts.claim(worker_id="w", lease_seconds=86400)
    assert c.run_deadline_at is not None
    run_lifecycle(store, dsn, now=c.run_deadline_at + timedelta(minutes=50))
    timeout = lag(store, "lifecycle_lag", label="timeout")
    assert timeout[3600.0] == 1 and timeout[-1] == pytest.approx(3000)


# -- a parent's finalization -----------------------------------------------------------------

def finish_children(store: Store, kids: list[UUID], queue: str = "default") -> None:
    claims = {c.job_id: c for c in store.attempts.claim(worker_id="w", lease_seconds=600,
                                                        limit=len(kids), queue=queue)}
    for kid in kids:
        assert store.attempts.finish(job_id=kid, attempt_id=claims[kid].attempt_id,
                                     succeeded=True)


def test_finalization_records_how_long_after_the_last_child_it_came(
        store: Store, dsn: str) -> None:
    parent, kids = make_parent(store, 3)
    finish_children(store, kids)
    sql(store, "UPDATE jobs SET finished_at = now() - interval '100 seconds' "
               "WHERE parent_id = %s", parent)
    sql(store, "UPDATE jobs SET finished_at = now() - interval '25 seconds' WHERE job_id = %s",
        kids[1])
    s = load_settings(database_url=dsn)
    report = export_finalize.run_once(s, Deps(store, s))
    assert report.parents_succeeded == 1
    finalized = lag(store, "finalize_lag")
    assert finalized[30.0] == 1 and 25 <= finalized[-1] < 30
    got = samples(store)
    name = "jobfence_parent_finalize_lag_seconds_bucket"
    assert got[(name, (("le", "10.0"), ("queue", "default")))] == 0
    assert got[(name, (("le", "30.0"), ("queue", "default")))] == 1


def test_racing_finalizers_record_one_finalization(store: Store, dsn: str) -> None:
    parent, kids = make_parent(store, 2, queue="datums")
    finish_children(store, kids, queue="datums")
    start = threading.Barrier(4)
    won: list[object] = []

    def finalize() -> None:
        mine = Store(connect(dsn))
        try:
            start.wait()
            won.append(finalize_parent(mine, MemoryObjectStore, None,
                                       installation(mine), parent))
        finally:
            mine.conn.close()

    threads = [threading.Thread(target=finalize) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(w is not None for w in won) == 1
    finalized = lag(store, "finalize_lag", queue="datums")
    assert sum(v for k, v in finalized.items() if k >= 0) == 1


def test_a_parent_finalized_by_lifecycle_is_measured_and_a_cancelled_one_is_not(
        store: Store, dsn: str) -> None:
    parent, _ = make_parent(store, 1, timeout_seconds=60, max_attempts=1)
    [c] = store.attempts.claim(worker_id="w", lease_seconds=600)
    assert c.run_deadline_at is not None
    report = run_lifecycle(store, dsn, now=c.run_deadline_at + timedelta(seconds=1))
    assert report.parents_finalized == 1
    assert sum(v for k, v in lag(store, "finalize_lag").items() if k >= 0) == 1
    cancelled, _ = make_parent(store, 2)
    store.jobs.cancel(job_id=cancelled)
    assert sum(v for k, v in lag(store, "finalize_lag").items() if k >= 0) == 1
    assert store.jobs.get(parent).status == "failed"  # type: ignore[union-attr]


# -- what lifecycle has not done yet ---------------------------------------------------------

def test_the_overdue_gauge_shows_the_oldest_deadline_not_yet_enforced(
        store: Store, dsn: str) -> None:
    assert store.job_metrics.overdue() == {"expiry": 0, "retention": 0, "timeout": 0}
    running = enqueue_one(store, timeout_seconds=3600)
    store.attempts.claim(worker_id="w", lease_seconds=600)
    sql(store, "UPDATE jobs SET run_deadline_at = now() - interval '100 seconds' "
               "WHERE job_id = %s", running)
    pending = enqueue_one(store, expires_in_seconds=3600)
    sql(store, "UPDATE jobs SET expires_at = now() - interval '20 seconds' WHERE job_id = %s",
        pending)
    enqueue_one(store, expires_in_seconds=3600)  # not due yet: never counts
    kept = enqueue_one(store, ttl_seconds=3600, queue="done")
    no_ttl = enqueue_one(store, queue="done")
    for _ in range(2):
        [c] = store.attempts.claim(worker_id="w", lease_seconds=600, queue="done")
        assert store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True)
    sql(store, "UPDATE jobs SET retain_until = now() - interval '300 seconds' "
               "WHERE job_id = %s", kept)
    sql(store, "UPDATE jobs SET finished_at = now() - interval '31 days' WHERE job_id = %s",
        no_ttl)
    without = store.job_metrics.overdue()
    assert 100 <= without["timeout"] < 110 and 20 <= without["expiry"] < 30
    assert 300 <= without["retention"] < 310  # jobs without a ttl need the default to count
    month = timedelta(days=30)
    assert 86400 <= store.job_metrics.overdue(default_retention=month)["retention"] < 86410
    gauge = samples(store, default_retention=month)
    assert 86400 <= gauge[("jobfence_lifecycle_overdue_seconds", (("kind", "retention"),))]
    run_lifecycle(store, dsn)
    assert store.job_metrics.overdue(default_retention=month) == {
        "expiry": 0, "retention": 0, "timeout": 0}
