"""Job metrics (migration 0015, ``jobfence.store.job_metrics``): after a mix of jobs in two
queues — succeeded, failed after a retry, cancelled pending and running, a lost fence, a
SIGTERM give-back — the folded counters and histogram counts equal what the audit trail
says, per queue; a fold is exact (a second one adds nothing); the exposition shows them."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobfence import metrics
from jobfence.store import IMMEDIATE, Store
from tests.support.factories import enqueue_one

pytestmark = pytest.mark.pooled


def claim(store: Store, queue: str, lease: float = 300) -> Any:
    [c] = store.attempts.claim(worker_id="w", lease_seconds=lease, queue=queue)
    return c


def mix(store: Store) -> None:
    # default: one succeeds; one fails once (retried), then fails for good.
    ok = enqueue_one(store)
    c = claim(store, "default")
    assert c.job_id == ok
    store.attempts.finish(job_id=ok, attempt_id=c.attempt_id, succeeded=True)
    bad = enqueue_one(store, max_attempts=2)
    c = claim(store, "default")
    store.attempts.release(job_id=bad, attempt_id=c.attempt_id, reason="exit 1",
                           retry=IMMEDIATE, error="exit 1")
    c = claim(store, "default")
    store.attempts.finish(job_id=bad, attempt_id=c.attempt_id, succeeded=False, error="exit 1")
    # default: a SIGTERM gives one back, which then succeeds.
    back = enqueue_one(store)
    c = claim(store, "default")
    store.attempts.interrupt(job_id=back, attempt_id=c.attempt_id,
                             reason="worker received SIGTERM", max_interruptions=10)
    c = claim(store, "default")
    store.attempts.finish(job_id=back, attempt_id=c.attempt_id, succeeded=True)
    # datums: cancelled while pending, cancelled while running; a lost fence, then success.
    store.jobs.cancel(job_id=enqueue_one(store, queue="datums"))
    running = enqueue_one(store, queue="datums")
    claim(store, "datums")
    store.jobs.cancel(job_id=running)
    lost = enqueue_one(store, queue="datums")
    claim(store, "datums", lease=1)
    later = datetime.now(UTC) + timedelta(seconds=5)
    [t] = store.maintenance.reclaim_expired(retry=IMMEDIATE, batch_size=10, now=later)
    assert t.job_id == lost
    c = claim(store, "datums")
    store.attempts.finish(job_id=lost, attempt_id=c.attempt_id, succeeded=True)
    enqueue_one(store, queue="datums")  # pending: counts nowhere yet


def from_audit(conn: Any) -> dict[str, Counter[tuple[str, str]]]:
    """What the audit trail says, computed independently of the trigger."""
    rows = conn.execute("""
        SELECT j.queue, e.from_status, e.to_status, e.reason
        FROM job_events e JOIN jobs j USING (job_id) ORDER BY e.event_id""").fetchall()
    out: dict[str, Counter[tuple[str, str]]] = {
        "finished": Counter(), "attempts": Counter(), "wait": Counter(), "run": Counter()}
    for r in rows:
        q, was, now, why = r["queue"], r["from_status"], r["to_status"], r["reason"] or ""
        if now in ("succeeded", "failed", "cancelled") and was != now:
            out["finished"][(q, now)] += 1
        if was == "running":
            if now in ("succeeded", "cancelled"):
                outcome = now
            elif why.startswith(("lease expired", "worker pod ")):
                outcome = "lost"
            elif now == "pending":
                outcome = "interrupted" if why == "worker received SIGTERM" else "retried"
            else:
                outcome = "failed"
            out["attempts"][(q, outcome)] += 1
            if now in ("succeeded", "failed", "cancelled"):
                out["run"][(q, "")] += 1
        if was == "pending" and now == "running":
            out["wait"][(q, "")] += 1
    return out


def folded(store: Store) -> dict[str, Counter[tuple[str, str]]]:
    out: dict[str, Counter[tuple[str, str]]] = {
        "finished": Counter(), "attempts": Counter(), "wait": Counter(), "run": Counter()}
    for t in store.job_metrics.totals():
        if t.name in out:
            out[t.name][(t.queue, t.label)] += int(t.value)
    return out


def test_folded_counters_and_histograms_equal_the_audit_trail_per_queue(
        store: Store, conn: Any) -> None:
    mix(store)
    assert store.job_metrics.totals() == []  # nothing folded yet
    assert store.job_metrics.fold() > 0
    expected = from_audit(conn)
    assert folded(store) == expected
    assert expected["finished"] == Counter({
        ("default", "succeeded"): 2, ("default", "failed"): 1,
        ("datums", "cancelled"): 2, ("datums", "succeeded"): 1})
    assert expected["attempts"] == Counter({
        ("default", "succeeded"): 2, ("default", "retried"): 1, ("default", "failed"): 1,
        ("default", "interrupted"): 1, ("datums", "cancelled"): 1, ("datums", "lost"): 1,
        ("datums", "succeeded"): 1})
    # A second fold adds nothing; more work adds exactly its share.
    assert store.job_metrics.fold() == 0
    assert folded(store) == expected
    mix(store)
    store.job_metrics.fold()
    assert folded(store) == from_audit(conn)


def test_histograms_sum_what_was_observed(store: Store, conn: Any) -> None:
    job = enqueue_one(store)
    conn.execute("UPDATE jobs SET visible_at = now() - interval '42 seconds' WHERE job_id = %s",
                 (job,))
    c = claim(store, "default")
    conn.execute("UPDATE jobs SET claimed_at = now() - interval '7 seconds' WHERE job_id = %s",
                 (job,))
    store.attempts.finish(job_id=job, attempt_id=c.attempt_id, succeeded=True)
    store.job_metrics.fold()
    totals = {(t.name, t.le): t.value for t in store.job_metrics.totals()}
    assert totals[("wait", 60.0)] == 1 and 42 <= totals[("wait_sum", float("inf"))] < 45
    assert totals[("run", 10.0)] == 1 and 7 <= totals[("run_sum", float("inf"))] < 10
    text = metrics.exposition(store)
    assert 'jobfence_job_wait_seconds_bucket{le="30.0",queue="default"} 0.0' in text
    assert 'jobfence_job_wait_seconds_bucket{le="60.0",queue="default"} 1.0' in text
    assert 'jobfence_job_wait_seconds_bucket{le="+Inf",queue="default"} 1.0' in text
    assert 'jobfence_job_wait_seconds_count{queue="default"} 1.0' in text
    assert 'jobfence_job_run_seconds_bucket{le="10.0",queue="default"} 1.0' in text
    assert 'jobfence_jobs_finished_total{queue="default",status="succeeded"} 1.0' in text
    assert 'jobfence_job_attempts_total{outcome="succeeded",queue="default"} 1.0' in text


def test_concurrent_folds_count_every_delta_once(store: Store, conn: Any, dsn: str) -> None:
    from jobfence import db

    for _ in range(40):
        job = enqueue_one(store)
        c = claim(store, "default")
        store.attempts.finish(job_id=job, attempt_id=c.attempt_id, succeeded=True)
    start = threading.Barrier(4)
    folds: list[int] = []

    def fold() -> None:
        c = db.connect(dsn, pooler=getattr(dsn, "pooler", "none"))
        try:
            start.wait()
            folds.append(Store(c).job_metrics.fold())
        finally:
            c.close()

    threads = [threading.Thread(target=fold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sum(folds) > 0
    assert folded(store)["finished"] == Counter({("default", "succeeded"): 40})
    assert folded(store)["wait"] == Counter({("default", ""): 40})


def test_actions_stopped_for_inactivity_or_timeout_are_counted_and_exported(
        store: Store) -> None:
    """A worker gives a job back with the reason ``inactive`` (an action quiet past its
    inactivity timeout) or ``timed out``: counted by queue and why, whether the job is
    retried or failed; a cancel that happens to say "inactive" is not a stop."""
    quiet = enqueue_one(store, max_attempts=2)
    for _ in range(2):  # retried, then failed: two stops
        c = claim(store, "default")
        store.attempts.release(job_id=quiet, attempt_id=c.attempt_id, reason="inactive",
                               retry=IMMEDIATE, error="inactive: no output or progress")
    slow = enqueue_one(store, queue="datums", max_attempts=1)
    c = claim(store, "datums")
    store.attempts.release(job_id=slow, attempt_id=c.attempt_id, reason="timed out",
                           retry=IMMEDIATE, error="timed out")
    said = enqueue_one(store)
    claim(store, "default")
    store.jobs.cancel(job_id=said, reason="inactive")
    store.job_metrics.fold()
    stops = {(t.queue, t.label): t.value for t in store.job_metrics.totals()
             if t.name == "stops"}
    assert stops == {("default", "inactive"): 2, ("datums", "timed_out"): 1}
    text = metrics.exposition(store)
    assert 'jobfence_job_stops_total{queue="default",why="inactive"} 2.0' in text
    assert 'jobfence_job_stops_total{queue="datums",why="timed_out"} 1.0' in text
