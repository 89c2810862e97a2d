"""Each pool's ScaledJob query, taken from the rendered manifests, against a real
PostgreSQL in the states a queue goes through, beside jobs of other queues. KEDA's default
scaling strategy, applied with the pool's own targetQueryValue, activationTargetQueryValue
and maxReplicaCount, must start exactly one worker per unit of its queue's ready work:
none for other queues' work, none while draining or while its queue is paused, none for
jobs backing off, scheduled, waiting or finished, none past the queue's limit, only the
difference while some workers already run. With a million finished jobs in the table the
query stays on its partial indexes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.sqlconn import connect
from jobfence.db import Connection
from jobfence.store import RetryPolicy, Store
from tests.support.factories import enqueue_one, new_job
from tests.support.keda import Trigger, claim, trigger_of, value
from tests.support.manifests import Obj, pools
from tests.support.pg import Databases

FINISHED = 1_000_000
QUEUES = [p.queue for p in pools().pools]


@pytest.fixture(scope="module", params=[p.name for p in pools().pools if p.concurrency == 1])
def trigger(base: list[Obj], request: pytest.FixtureRequest) -> Trigger:
    """A pool whose pods run one job at a time (test_keda_concurrency.py: the others)."""
    return trigger_of(base, request.param)


@pytest.fixture
def store(store: Store, trigger: Trigger) -> Store:
    """The test's database, with work of every other queue in it too (ready, running,
    scheduled): none of it may count for this pool."""
    others = [p.queue for p in pools().pools if p.queue != trigger.queue] + ["reports"]
    for queue in others:
        store.jobs.enqueue([new_job(queue=queue) for _ in range(3)])
        store.jobs.enqueue([new_job(queue=queue, delay_seconds=3600)])
        assert len(store.attempts.claim(worker_id="other-pod", lease_seconds=300,
                                        queue=queue)) == 1
    return store


def ready(conn: Connection, queue: str) -> int:
    row = conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'pending' "
                       "AND visible_at <= now() AND queue = %s", (queue,)).fetchone()
    assert row is not None
    return int(row["n"])


# -- states of the queue ------------------------------------------------------------------

def test_an_empty_queue_starts_no_worker(store: Store, trigger: Trigger) -> None:
    assert value(store.conn, trigger) == 0
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == 0


def test_each_ready_job_starts_one_worker(store: Store, trigger: Trigger) -> None:
    for _ in range(7):
        enqueue_one(store, queue=trigger.queue)
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == 7 == ready(
        store.conn, trigger.queue)


def test_running_workers_start_only_the_difference(store: Store,
                                                   trigger: Trigger) -> None:
    for _ in range(10):
        enqueue_one(store, queue=trigger.queue)
    claim(store, 4, trigger.queue)  # four worker pods hold claims: four unfinished KEDA Jobs
    assert value(store.conn, trigger) == 10
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=4) == 6 == ready(
        store.conn, trigger.queue)


def test_drain_mode_starts_no_worker(store: Store, trigger: Trigger) -> None:
    for _ in range(5):
        enqueue_one(store, queue=trigger.queue)
    claim(store, 2, trigger.queue)
    store.control.set_drain(on=True, reason="upgrade")
    assert value(store.conn, trigger) == 0
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=2) == 0
    store.control.set_drain(on=False)
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=2) == 3 == ready(
        store.conn, trigger.queue)


def test_jobs_backing_off_start_no_worker_until_due(store: Store,
                                                    trigger: Trigger) -> None:
    for _ in range(3):
        enqueue_one(store, queue=trigger.queue)
    # Two attempts failed: back to pending, due in the future.
    for c in claim(store, 2, trigger.queue):
        store.attempts.release(job_id=c.job_id, attempt_id=c.attempt_id, reason="failed",
                      retry=RetryPolicy(base_seconds=3600, cap_seconds=3600), error="boom")
    assert store.conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'pending' "
                              "AND queue = %s", (trigger.queue,)).fetchone() == {"n": 3}
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == 1 == ready(
        store.conn, trigger.queue)


def test_waiting_jobs_and_parents_start_no_worker(store: Store, trigger: Trigger) -> None:
    first = enqueue_one(store, queue=trigger.queue)
    store.jobs.enqueue([new_job(after=(first,), queue=trigger.queue)])  # waits for `first`
    store.conn.execute(  # a datum parent runs from the start and is never claimed
        "INSERT INTO jobs (job_id, status, actions, max_attempts, is_parent, started_at, "
        "queue) VALUES (gen_random_uuid(), 'running', '[]', 1, true, now(), %s)",
        (trigger.queue,))
    assert value(store.conn, trigger) == 1
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == 1 == ready(
        store.conn, trigger.queue)


def test_more_ready_work_than_max_replicas_starts_up_to_the_max(store: Store,
                                                                 trigger: Trigger) -> None:
    store.jobs.enqueue([new_job(queue=trigger.queue)
                        for _ in range(trigger.max_replicas + 5)])
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == trigger.max_replicas
    claim(store, 3, trigger.queue)
    assert trigger.new_jobs(value(store.conn, trigger),
                            running_jobs=3) == trigger.max_replicas - 3


def test_polls_between_job_creation_and_claim_start_no_extra_worker(
        store: Store, trigger: Trigger) -> None:
    """KEDA counts a Job as running from its creation; the query counts its work as ready
    until the pod claims it, then as claimed: the sum stays the same, so no poll in
    between starts a second worker for the same job."""
    for _ in range(5):
        enqueue_one(store, queue=trigger.queue)
    keda_jobs = trigger.new_jobs(value(store.conn, trigger), running_jobs=0)
    assert keda_jobs == 5
    # Pods still starting: nothing claimed yet.
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=keda_jobs) == 0
    claims = claim(store, 5, trigger.queue)
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=keda_jobs) == 0
    for c in claims[:2]:  # two workers finish and their Jobs complete
        store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True)
    keda_jobs -= 2
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=keda_jobs) == 0
    store.jobs.enqueue([new_job(queue=trigger.queue), new_job(queue=trigger.queue)])
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=keda_jobs) == 2


def test_a_paused_queue_starts_no_worker_and_its_running_job_finishes(
        store: Store, trigger: Trigger) -> None:
    for _ in range(4):
        enqueue_one(store, queue=trigger.queue)
    [running] = claim(store, 1, trigger.queue)
    store.queues.configure(trigger.queue, paused=True, reason="a bad release")
    assert value(store.conn, trigger) == 0
    enqueue_one(store, queue=trigger.queue)  # enqueue goes on
    assert store.attempts.claim(worker_id="p", lease_seconds=60, queue=trigger.queue) == []
    assert store.attempts.finish(job_id=running.job_id, attempt_id=running.attempt_id,
                                 succeeded=True) is not None
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == 0
    store.queues.configure(trigger.queue, paused=False)
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == 4 == ready(
        store.conn, trigger.queue)


def test_a_limited_queue_starts_no_worker_past_its_limit(store: Store,
                                                         trigger: Trigger) -> None:
    """More pods could not claim: the claim itself refuses past the limit."""
    for _ in range(8):
        enqueue_one(store, queue=trigger.queue)
    store.queues.configure(trigger.queue, limit=3, set_limit=True)
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == 3
    claim(store, 3, trigger.queue)
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=3) == 0
    assert store.attempts.claim(worker_id="p", lease_seconds=60, queue=trigger.queue) == []
    store.queues.configure(trigger.queue, set_limit=True, limit=None)
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=3) == 5


def test_a_scheduled_job_starts_a_worker_only_when_due(store: Store,
                                                       trigger: Trigger) -> None:
    job = enqueue_one(store, queue=trigger.queue, delay_seconds=3600)
    assert value(store.conn, trigger) == 0
    assert store.attempts.claim(worker_id="p", lease_seconds=60, queue=trigger.queue) == []
    store.conn.execute("UPDATE jobs SET visible_at = now() - interval '1 second', "
                       "run_at = now() - interval '1 second' WHERE job_id = %s", (job,))
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == 1
    [c] = claim(store, 1, trigger.queue)
    assert c.job_id == job


# -- a long history -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_history(databases: Databases) -> Iterator[Store]:
    """A million finished jobs of every pool's queue (history awaiting retention); in each
    queue 8 ready and 4 running. The audit trigger is off for the bulk insert: the
    history's own events do not matter."""
    url = databases.create()
    conn = connect(url)
    try:
        store = Store(conn)
        with conn.transaction():
            conn.execute("ALTER TABLE jobs DISABLE TRIGGER jobs_audit_insert")
            conn.execute("""
                INSERT INTO jobs (job_id, status, actions, max_attempts, attempt_count,
                                  attempt_id, started_at, finished_at, queue)
                SELECT id, (ARRAY['succeeded', 'succeeded', 'succeeded', 'failed',
                                  'cancelled'])[mod(i, 5) + 1],
                       '[]', 3, 1, id,
                       now() - interval '3 days', now() - make_interval(secs => (%s - i) / 10.0),
                       (%s::text[])[mod(i, cardinality(%s::text[])) + 1]
                FROM generate_series(1, %s) AS i,
                     -- ids in insertion order, as uuid7 makes them: a fast bulk load
                     LATERAL (SELECT lpad(to_hex(i), 32, '0')::uuid AS id) AS ids
            """, (FINISHED, QUEUES, QUEUES, FINISHED))
            conn.execute("ALTER TABLE jobs ENABLE TRIGGER jobs_audit_insert")
        for queue in QUEUES:
            store.jobs.enqueue([new_job(queue=queue) for _ in range(12)])
            claim(store, 4, queue)
        conn.execute("ANALYZE jobs")
        yield store
    finally:
        conn.close()
        databases.drop(url)


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def test_a_million_finished_jobs_start_no_worker(long_history: Store,
                                                 trigger: Trigger) -> None:
    conn = long_history.conn
    assert value(conn, trigger) == 12
    assert trigger.new_jobs(value(conn, trigger), running_jobs=4) == 8 == ready(
        conn, trigger.queue)


def test_the_query_never_scans_the_whole_jobs_table(long_history: Store,
                                                    trigger: Trigger) -> None:
    conn = long_history.conn
    [row] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + trigger.query).fetchall()
    nodes = list(plan_nodes(row["QUERY PLAN"][0]["Plan"]))
    on_jobs = [n for n in nodes if n.get("Relation Name") == "jobs"]
    assert on_jobs, "the plan does not read jobs at all"
    assert not [n for n in on_jobs if n["Node Type"] == "Seq Scan"], on_jobs
    # Partial indexes over active jobs only: finished ones are not in them at all.
    for n in on_jobs:
        row = conn.execute("SELECT pg_get_expr(i.indpred, i.indrelid) AS pred FROM pg_index i "
                           "WHERE i.indexrelid = %s::regclass", (n["Index Name"],)).fetchone()
        assert row is not None and row["pred"], n["Index Name"]
        assert "status" in row["pred"], row
        assert not {"succeeded", "failed", "cancelled"} & set(
            re.findall(r"'(\w+)'", row["pred"])), row
    # What it reads does not grow with the history: a few pages of a table of thousands.
    touched = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
                  for n in nodes)
    pages = conn.execute("SELECT relpages FROM pg_class WHERE relname = 'jobs'").fetchone()
    assert pages is not None and pages["relpages"] > 5_000
    assert touched < pages["relpages"] / 100, (touched, pages["relpages"])
