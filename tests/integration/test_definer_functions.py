"""The functions of an installed schema, read from the catalog (invariant 13): every
``SECURITY DEFINER`` function pins its search path to the schema with ``pg_temp`` last and
names every relation with the schema, so no future migration can bring back a function
that a caller's temporary table can stand in for; the store's statements name every
relation of the schema with it; the worker's writes carry the fence in their installed
bodies; and a login of each role that plants temporary tables named like
every table of the schema changes nothing of what the triggers write.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from devtools.roles import ensure_logins
from jobfence import db
from jobfence.store import RetryPolicy, Store
from tests.support import Dsn
from tests.support.factories import enqueue_one

STORE = Path(inspect.getfile(Store)).parent


@pytest.fixture
def catalog(conn: psycopg.Connection[dict[str, Any]]) -> list[dict[str, Any]]:
    return conn.execute("""
        SELECT p.proname AS name, p.prosecdef AS definer, p.proconfig AS config,
               p.prosrc AS body, pg_get_function_result(p.oid) AS returns,
               p.provolatile = 'v' AS writes, coalesce(p.proargnames, '{}') AS args
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'jobfence' ORDER BY p.proname""").fetchall()


@pytest.fixture
def relations(conn: psycopg.Connection[dict[str, Any]]) -> list[str]:
    return [r["relname"] for r in conn.execute("""
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'jobfence' AND c.relkind IN ('r', 'p', 'v', 'm')""")]


def test_every_definer_function_pins_the_schema_then_pg_temp(
        catalog: list[dict[str, Any]]) -> None:
    definers = [f for f in catalog if f["definer"]]
    assert len(definers) >= 20
    for f in definers:
        paths = [c for c in f["config"] or [] if c.startswith("search_path=")]
        assert paths == ["search_path=jobfence, pg_temp"], (f["name"], f["config"])


def test_every_statement_of_the_store_names_the_schemas_relations_with_it(
        relations: list[str]) -> None:
    """No statement can reach a relation of the caller's search path (an application's own
    ``jobs``): every relation the schema has is named with the schema in the store's SQL."""
    assert len(relations) >= 10
    bare = re.compile(r"\b(?:FROM|JOIN|UPDATE|INTO)\s+(" + "|".join(
        map(re.escape, relations)) + r")\b", re.IGNORECASE)
    for path in STORE.glob("*.sql"):
        found = bare.findall(path.read_text())
        assert not found, (path.name, found)


def test_every_definer_function_names_its_relations_with_the_schema(
        catalog: list[dict[str, Any]], relations: list[str]) -> None:
    """A relation of the schema named bare in a body would be resolved through the search
    path: with pg_temp last that is safe today, and one slip in a migration away from a
    caller's temporary table."""
    where = re.compile(r"\b(?:FROM|JOIN|UPDATE|INTO|TABLE)\s+(" + "|".join(
        map(re.escape, relations)) + r")\b", re.IGNORECASE)
    for f in (f for f in catalog if f["definer"]):
        code = re.sub(r"--[^\n]*", "", f["body"])
        code = re.sub(r"'[^']*'", "''", code)  # no literals
        assert not where.findall(code), (f["name"], where.findall(code))


STOPPING_ONLY = {"worker_stopped"}
"""The one write of a worker that acts on an attempt after its fence was rotated: it clears
the stopping mark of the attempt it names (``stopping_attempt_id``), and nothing else."""

ONE_OF_MANY = {"worker_interrupt": "worker_interrupt_many"}
"""The writes of one attempt that are a batch of one: the batch's own function matches each
row on its attempt (``a.attempt_id``, the batch's pairs) and its lease."""

AFTER_THE_END = {"worker_finalize_parent"}
"""The one write of a worker after its attempt's own terminal write: the parent of the
child that attempt ended, once no child of it is active (``jobfence_parent_of_attempt``)."""


def test_the_workers_writes_carry_the_fence_as_installed(catalog: list[dict[str, Any]]) -> None:
    """Every write after a claim — each installed ``worker_*`` function that may write and
    names an attempt — matches only that attempt and checks the lease against the clock of
    the moment the row is checked (``now()`` is the transaction's start: a write that
    waited on a lock past its lease would still match)."""
    writes = {f["name"]: f["body"] for f in catalog if f["name"].startswith("worker_")
              and f["writes"] and "p_attempt_id" in f["args"]}
    assert len(writes) >= 8 and STOPPING_ONLY <= writes.keys()
    for name, body in writes.items():
        if name in STOPPING_ONLY:
            assert re.search(r"\bstopping_attempt_id = p_attempt_id\b", body), name
            continue
        if name in AFTER_THE_END:
            assert "jobfence_parent_of_attempt(p_child_id, p_attempt_id)" in body, name
            continue
        if name in ONE_OF_MANY:
            assert f"{ONE_OF_MANY[name]}(ARRAY[p_job_id], ARRAY[p_attempt_id]" in body, name
            batch = next(f["body"] for f in catalog if f["name"] == ONE_OF_MANY[name])
            assert "j.attempt_id = a.attempt_id" in batch, name
            assert "visible_at > clock_timestamp()" in batch, name
            continue
        assert re.search(r"\battempt_id = p_attempt_id\b", body), name
        assert "visible_at > clock_timestamp()" in body, name
        assert "visible_at > now()" not in body, name
    bodies = {f["name"]: f["body"] for f in catalog}
    assert "j.attempt_id = a.attempt_id" in bodies["worker_holding"]
    assert "stopping_attempt_id = p_attempt_id" in bodies["worker_stopped"]


def test_no_worker_function_returns_a_live_fence(catalog: list[dict[str, Any]]) -> None:
    """A worker's role can read its own claim's attempt_id (the claim returns it) and no
    other live one: besides the claim, only the page of a parent's children for its manifest
    carries attempt ids — the kept ids of terminal children, answered only once no child of
    that parent is active (tests/integration/test_parents.py tries the rest)."""
    for f in (f for f in catalog if f["name"].startswith("worker_")):
        assert ("attempt_id" in f["returns"]) == (
            f["name"] in {"worker_claim", "worker_parent_children"}), f["name"]
    bodies = {f["name"]: f["body"] for f in catalog}
    assert "jobfence_parent_of_attempt" in bodies["worker_parent_children"]
    assert "s.status IN ('waiting', 'pending', 'running')" in bodies["jobfence_parent_of_attempt"]


# -- temporary tables named like ours ---------------------------------------------------------


@pytest.fixture
def decoys(conn: psycopg.Connection[dict[str, Any]], relations: list[str]) -> str:
    """DDL that creates, in the session that runs it, a temporary table named like every
    table of the schema, with the same columns and open to everyone, and puts pg_temp
    first in the session's search path."""
    statements = [sql.SQL("SET search_path = pg_temp, jobfence, public")]
    for name in relations:
        columns = conn.execute("""
            SELECT a.attname AS column, format_type(a.atttypid, a.atttypmod) AS type
            FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0
              AND NOT a.attisdropped ORDER BY a.attnum""",
                               (f"jobfence.{name}",)).fetchall()
        statements.append(sql.SQL("CREATE TEMPORARY TABLE {} ({})").format(
            sql.Identifier(name), sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(c["column"]), sql.SQL(c["type"]))
                for c in columns)))
        # Open to every role, the owner's included: a function running as the owner that
        # resolved a name to the decoy would write into it without a complaint.
        statements.append(sql.SQL("GRANT ALL ON pg_temp.{} TO PUBLIC").format(
            sql.Identifier(name)))
    return sql.SQL("; ").join(statements).as_string(None)


@contextmanager
def planted(url: str, ddl: str, schema: str = "jobfence") -> Iterator[Store]:
    """A store over a login's session that has planted the decoys; on leaving, every decoy
    must still be empty."""
    conn = db.connect(url)
    conn.execute(ddl)  # type: ignore[arg-type]  # built above from the catalog
    try:
        yield Store(conn, schema)
    finally:
        leftovers = {r["relname"]: conn.execute(
            sql.SQL("SELECT count(*) AS n FROM pg_temp.{}").format(
                sql.Identifier(r["relname"]))).fetchone()
            for r in conn.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n "
                                  "ON n.oid = c.relnamespace WHERE n.oid = pg_my_temp_schema()")}
        conn.close()
        assert all(row is not None and row["n"] == 0 for row in leftovers.values()), leftovers


def trail(conn: psycopg.Connection[dict[str, Any]], job: UUID) -> list[tuple[Any, ...]]:
    return [(r["from_status"], r["to_status"]) for r in conn.execute(
        "SELECT from_status, to_status FROM jobfence.job_events WHERE job_id = %s "
        "ORDER BY event_id", (job,))]


def deltas(conn: psycopg.Connection[dict[str, Any]]) -> int:
    row = conn.execute("SELECT count(*) AS n FROM jobfence.job_metric_deltas").fetchone()
    return int(row["n"]) if row else 0


def test_temporary_tables_change_nothing_the_worker_writes(
        dsn: Dsn, store: Store, conn: psycopg.Connection[dict[str, Any]], decoys: str) -> None:
    logins = ensure_logins(dsn.direct)
    job = enqueue_one(store)
    before = deltas(conn)
    with planted(logins["worker"], decoys) as worker:
        [claim] = worker.attempts.claim(worker_id="w", lease_seconds=60)
        assert worker.attempts.heartbeat(job_id=job, attempt_id=claim.attempt_id,
                                         lease_seconds=60) is not None
        assert worker.attempts.finish(job_id=job, attempt_id=claim.attempt_id,
                                      succeeded=True) is not None
    assert trail(conn, job) == [(None, "pending"), ("pending", "running"),
                                ("running", "succeeded")]
    assert deltas(conn) > before


def test_temporary_tables_change_nothing_the_operator_writes(
        dsn: Dsn, store: Store, conn: psycopg.Connection[dict[str, Any]], decoys: str) -> None:
    logins = ensure_logins(dsn.direct)
    with planted(logins["operator"], decoys) as operator:
        job = enqueue_one(operator)
        operator.jobs.cancel(job_id=job, reason="changed my mind")
        operator.jobs.retry(job_id=job, reason="again")
        operator.queues.configure("default", paused=True, reason="incident", actor="me")
        operator.control.set_drain(on=True, reason="upgrade", actor="me")
        operator.control.set_drain(on=False, actor="me")
        # A direct write to the job is refused outright, temporary tables or not.
        with pytest.raises(Exception, match="permission denied"):
            operator.conn.execute("UPDATE jobfence.jobs SET status = 'succeeded', "
                                  "finished_at = now() WHERE job_id = %s", (job,))
        operator.conn.rollback()
    assert trail(conn, job) == [(None, "pending"), ("pending", "cancelled"),
                                ("cancelled", "pending")]
    actions = [r["action"] for r in conn.execute(
        "SELECT action FROM jobfence.control_events ORDER BY event_id")]
    assert actions == ["queue_pause", "drain_on", "drain_off"]


def test_temporary_tables_change_nothing_the_maintainer_writes(
        dsn: Dsn, store: Store, conn: psycopg.Connection[dict[str, Any]], decoys: str) -> None:
    logins = ensure_logins(dsn.direct)
    job = enqueue_one(store)
    store.attempts.claim(worker_id="w", lease_seconds=0.05)
    conn.execute("SELECT pg_sleep(0.1)")
    with planted(logins["maintainer"], decoys) as maintainer:
        [t] = maintainer.maintenance.reclaim_expired(retry=RetryPolicy(0, 0), batch_size=10)
        assert t.job_id == job
    assert trail(conn, job) == [(None, "pending"), ("pending", "running"),
                                ("running", "pending")]
