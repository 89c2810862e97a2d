"""Jobs `after` others, at scale: a terminal write releases a bounded batch of its
dependents inline and export-finalize the rest, in time linear in their number; an enqueue
never locks the job it waits on, so a running dependency keeps renewing its lease however
long the enqueue's transaction stays open."""

from __future__ import annotations

import json
import threading
import time
from uuid import UUID

import pytest

from devtools.sqlconn import connect
from jobfence.passes import export_finalize
from jobfence.passes.harness import Deps
from jobfence.settings import Settings
from jobfence.store import SETTLE_BATCH, Store
from tests.support import run_cli
from tests.support.factories import enqueue_one, new_job
from tests.support.procs import FAST, enqueue, events, job, log_events, spawn, wait_for

pytestmark = pytest.mark.pooled  # directly and through PgBouncer


def statuses(store: Store, ids: list[object]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in store.conn.execute("SELECT status, count(*) AS n FROM jobs "
                                  "WHERE job_id = ANY(%s) GROUP BY status", (ids,)):
        out[row["status"]] = row["n"]
    return out


def test_a_terminal_write_releases_a_bounded_batch_and_export_finalize_the_rest(
        dsn: str, store: Store) -> None:
    dependency = enqueue_one(store)
    n = SETTLE_BATCH * 2 + 500
    ids = [r.job_id for r in store.jobs.enqueue([new_job(after=(dependency,)) for _ in range(n)])]
    assert statuses(store, ids) == {"waiting": n}
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.attempts.finish(job_id=dependency, attempt_id=claim.attempt_id, succeeded=True)
    assert statuses(store, ids) == {"pending": SETTLE_BATCH, "waiting": n - SETTLE_BATCH}
    report = export_finalize.run_once(Settings(database_url=dsn), Deps(store, Settings(
        database_url=dsn)))
    assert report.dependents_released == n - SETTLE_BATCH
    assert statuses(store, ids) == {"pending": n}


def test_a_failed_dependency_fails_its_dependents_transitively(store: Store) -> None:
    a = enqueue_one(store, max_attempts=1)
    b = store.jobs.enqueue([new_job(after=(a,))])[0].job_id
    c = store.jobs.enqueue([new_job(after=(b,))])[0].job_id
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    store.attempts.finish(job_id=a, attempt_id=claim.attempt_id, succeeded=False, error="boom")
    for job_id, dep in ((b, a), (c, b)):
        row = store.jobs.get(job_id)
        assert row is not None and row.status == "failed"
        assert row.error == f"dependency {dep} failed"


def test_an_enqueue_never_blocks_its_running_dependencys_heartbeats(dsn: str) -> None:
    """The dependency runs 3.5 s on a 2 s lease while an application's transaction that
    enqueued a job after it stays open for 4 s: it renews its lease throughout and succeeds
    on its first claim. (A row lock held by the enqueue would block every heartbeat and the
    worker would fence itself.)"""
    dependency = enqueue(dsn, 'sleep:{"seconds": 3.5}')
    worker = spawn(dsn, "worker")
    wait_for(lambda: job(dsn, dependency)["status"] == "running", timeout=10)
    conn = connect(dsn)
    try:
        with conn.transaction():
            [made] = Store(conn).jobs.enqueue([new_job(after=(UUID(dependency),))])
            time.sleep(4.0)
    finally:
        conn.close()
    _out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "self_fenced" not in err and "heartbeat_failed" not in err
    row = job(dsn, dependency)
    assert row["status"] == "succeeded" and row["attempt_count"] == 1
    beats = [e for e in log_events(err) if e.get("event") == "heartbeat_failed"]
    assert beats == []
    # The dependency finished while the enqueue's transaction was still open: the caller's
    # commit came after the dependency's look for dependents. export-finalize releases it.
    assert job(dsn, str(made.job_id))["status"] == "waiting"
    r = run_cli(dsn, "export-finalize", **FAST)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dependents_released"] == 1
    assert job(dsn, str(made.job_id))["status"] == "pending"
    assert [e["to_status"] for e in events(dsn, dependency)] == ["pending", "running",
                                                                 "succeeded"]


def test_an_enqueue_of_thousands_after_a_running_job_holds_no_lock_on_it(
        dsn: str, store: Store) -> None:
    """While a large enqueue after a job is in flight, the job's own writes go through at
    once (they would wait for the enqueue's commit if it locked the row)."""
    dependency = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    conn = connect(dsn)
    other = Store(conn)
    started = threading.Event()
    try:
        with conn.transaction():
            other.jobs.enqueue([new_job(after=(dependency,)) for _ in range(5000)])
            started.set()
            t0 = time.monotonic()
            assert store.attempts.heartbeat(job_id=dependency, attempt_id=claim.attempt_id,
                                   lease_seconds=60) is not None
            assert time.monotonic() - t0 < 1.0
            store.conn.execute("SET lock_timeout = '500ms'")
            try:
                assert store.attempts.finish(job_id=dependency, attempt_id=claim.attempt_id,
                                    succeeded=True) is not None
            finally:
                store.conn.execute("RESET lock_timeout")
    finally:
        conn.close()
