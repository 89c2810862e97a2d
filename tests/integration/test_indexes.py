"""The queue's hot queries stay index scans however many finished jobs the table holds:
no sequential scan of jobs in the claim, the reclaim, the KEDA count, drain status, or the
comparisons with the cluster's pods and the object store's keys, or the lifecycle pass's
timeouts, expiry and retention pages and deletes, or the look for what it has not done yet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import LiteralString
from uuid import UUID

import pytest
from psycopg.errors import Diagnostic

from devtools.sqlconn import connect
from jobfence.db import queries
from jobfence.store import Store
from jobfence.store.queues import scaler_query
from tests.support.factories import enqueue_one
from tests.support.pg import Databases

FINISHED = 200_000
LATER = "2030-01-01T00:00:00Z"
FIRST_DUE = datetime(1, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def big_history(databases: Databases) -> Iterator[Store]:
    url = databases.create()
    conn = connect(url)
    store = Store(conn)
    store.conn.execute("""
        INSERT INTO jobs (job_id, status, actions, max_attempts, attempt_count, finished_at)
        SELECT gen_random_uuid(), 'succeeded', '[]', 3, 1, now() - interval '1 day'
        FROM generate_series(1, %s)
    """, (FINISHED,))
    for _ in range(20):
        enqueue_one(store)
    store.attempts.claim(worker_id="w", lease_seconds=60, limit=5)
    store.conn.execute("ANALYZE jobs")
    yield store
    conn.close()
    databases.drop(url)


SNAPSHOT = UUID(int=1)


def sql(noun: str, name: str) -> LiteralString:
    """A named statement of the store, for the default schema (the KEDA trigger's, as the
    default pool's ScaledJob has it)."""
    if (noun, name) == ("queues", "scaler_value"):
        return scaler_query("jobfence", "default")
    return queries("jobfence.store", f"{noun}.sql", "jobfence")[name]


def scanned_jobs_by(store: Store, query: LiteralString, params: dict[str, object]) -> set[str]:
    """How the plan reads the jobs table (EXPLAIN only: nothing is executed). A statement
    that calls one of the store's functions is run instead, in a transaction rolled back,
    with auto_explain reporting the plans of the statements inside it."""
    found: set[str] = set()

    def walk(node: dict[str, object]) -> None:
        if node.get("Relation Name") == "jobs":
            found.add(str(node["Node Type"]))
        for child in node.get("Plans", []):  # type: ignore[attr-defined]
            walk(child)

    if "worker_" not in query:
        [row] = store.conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchall()
        walk(row["QUERY PLAN"][0]["Plan"])
        return found
    plans: list[str] = []
    conn = store.conn

    def collect(diag: Diagnostic) -> None:
        plans.append(diag.message_primary or "")

    conn.add_notice_handler(collect)
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("LOAD 'auto_explain'")
            for setting, value in (("log_min_duration", "0"), ("log_nested_statements", "on"),
                                   ("log_format", "json")):
                conn.execute("SELECT set_config(%s, %s, true)", (f"auto_explain.{setting}", value))
            conn.execute("SET LOCAL client_min_messages = log")
            conn.execute(query, params).fetchall()
    finally:
        conn.remove_notice_handler(collect)
    for message in plans:
        if "plan:" in message:
            walk(json.loads(message.split("plan:", 1)[1])["Plan"])
    return found


@pytest.mark.parametrize(("noun", "name", "params"), [
    ("attempts", "claim", {"worker_id": "w", "lease_seconds": 60, "limit": 1,
                           "queue": "default", "claim_id": None}),
    ("maintenance", "reclaim_expired", {"batch_size": 500, "now": None, "base_seconds": 1.0,
                               "cap_seconds": 1.0}),
    ("queues", "scaler_value", {}),
    ("maintenance", "reclaim_timed_out", {"batch_size": 500, "now": None, "base_seconds": 1.0,
                                   "cap_seconds": 1.0}),
    ("maintenance", "expire_pending", {"batch_size": 500, "now": None}),
    ("maintenance", "delete_jobs", {"job_ids": [UUID(int=1)], "now": None,
                                    "retention_seconds": 30 * 86400}),
    ("job_metrics", "overdue", {"retention_seconds": 30 * 86400}),
    ("maintenance", "retention_due_with_ttl", {
        "now": None, "after_due": FIRST_DUE, "after_id": UUID(int=0), "limit": 500,
        "retention_seconds": 0}),
    ("maintenance", "retention_due_without_ttl", {
        "now": None, "after_due": FIRST_DUE, "after_id": UUID(int=0), "limit": 500,
        "retention_seconds": 30 * 86400}),
    ("control", "running_count", {}),
    ("queues", "status", {"queue": None}),
    ("pods", "reclaim_dead_claims", {
        "claimer_pattern": "^w", "listed_at": LATER, "grace_seconds": 0, "batch_size": 500,
        "base_seconds": 1.0, "cap_seconds": 1.0, "snapshot": SNAPSHOT}),
    ("pods", "unverifiable_claims", {"claimer_pattern": "^w"}),
    ("pods", "unclaimed_pods", {"listed_at": LATER, "grace_seconds": 0, "after": "",
                                "limit": 500, "snapshot": SNAPSHOT}),
    ("pods", "object_owners", {"pairs": '[{"job_id": "00000000-0000-0000-0000-000000000001"}]'}),
])
def test_hot_queries_never_scan_the_whole_table(big_history: Store, noun: str, name: str,
                                                params: dict[str, object]) -> None:
    scans = scanned_jobs_by(big_history, sql(noun, name), params)
    assert scans and "Seq Scan" not in scans, scans


def test_keda_count_counts_ready_plus_claimed(big_history: Store) -> None:
    row = big_history.conn.execute(sql("queues", "scaler_value")).fetchone()
    assert row == {"value": 20}
    big_history.control.set_drain(on=True)
    try:
        assert big_history.conn.execute(sql("queues", "scaler_value")).fetchone() == {"value": 0}
    finally:
        big_history.control.set_drain(on=False)


def test_retention_pages_come_in_index_order_without_a_sort(big_history: Store) -> None:
    # Every finished job is due (a zero default retention): a page must still read one
    # batch in (finished_at, job_id) order, not sort every due row, whatever the cursor.
    params = {"now": None, "after_due": FIRST_DUE, "after_id": UUID(int=0), "limit": 500,
              "retention_seconds": 0}
    [row] = big_history.conn.execute(
        "EXPLAIN (FORMAT JSON) " + sql("maintenance", "retention_due_without_ttl"),
        params).fetchall()
    plan = json.dumps(row["QUERY PLAN"])
    assert "jobs_retention_default_page" in plan and '"Sort"' not in plan, plan


def test_a_claim_from_a_deep_queue_reads_jobs_by_index_only(store: Store) -> None:
    # 8,000 ready jobs: the planner guesses a tenth of them for the claim's (computed) limit;
    # the update must still fetch its candidates by key, not hash the whole table per claim.
    store.conn.execute("""
        INSERT INTO jobs (job_id, status, actions, max_attempts)
        SELECT gen_random_uuid(), 'pending', '[]', 3 FROM generate_series(1, 8000)""")
    store.conn.execute("ANALYZE jobs")
    scans = scanned_jobs_by(store, sql("attempts", "claim"), {
        "worker_id": "w", "lease_seconds": 60, "limit": 1, "queue": "default",
        "claim_id": None})
    assert scans and "Seq Scan" not in scans, scans


PAGE = {"status": None, "resource": None, "parent_id": None, "queue": None, "labels": None,
        "after": None, "limit": 50}


@pytest.mark.parametrize(("filters", "index"), [
    ({"resource": "db.nowhere"}, "jobs_resource_page"),
    ({"queue": "reports"}, "jobs_queue_page"),
    ({"labels": '{"team": "nobody"}'}, "jobs_labels"),
    ({"status": "failed"}, "jobs_unsuccessful"),
    ({"resource": "db.nowhere", "after": UUID(int=1 << 127)}, "jobs_resource_page"),
])
def test_a_filter_that_matches_few_jobs_reads_its_index(big_history: Store,
                                                        filters: dict[str, object],
                                                        index: str) -> None:
    """`list`'s and the console's filters: a page of a resource, queue, label or status that
    no finished job matches reads that filter's index, never the whole table newest first
    (which took 0.15 s at a million jobs, over a second with ids out of time order)."""
    [row] = big_history.conn.execute("EXPLAIN (FORMAT JSON) " + sql("jobs", "page"),
                                     {**PAGE, **filters}).fetchall()
    plan = json.dumps(row["QUERY PLAN"])
    assert f'"Index Name": "{index}"' in plan and "Seq Scan" not in plan, plan
