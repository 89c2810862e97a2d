"""A server that takes no writes, and a connection lost during COMMIT, on a real PostgreSQL:
a read-only answer (SQLSTATE 25006, what a replica or a demoted primary gives) is "not
committed: connect again", never a refusal; the connection that gave it is replaced; a
reconnect that lands on a read-only server again writes nothing until a writer answers;
a worker against such a server never claims; and a terminal write whose backend is
terminated in the middle of its COMMIT ends written exactly once. (The same against a real
Patroni cluster, with replication, is tests/failover.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from jobfence import db
from jobfence.db import Connection
from jobfence.errors import ExitCode, NotWriter, StoreUnavailable
from jobfence.settings import Settings
from jobfence.store import Claim, Store, TerminalWrite
from jobfence.worker.guard import Guard
from jobfence.worker.store_link import StoreLink
from tests.support import SLOW_COMMIT, role_dsn, run_cli
from tests.support.factories import enqueue_one


def settings(dsn: str, **kw: Any) -> Settings:
    kw.setdefault("lease_seconds", 30)
    return Settings(database_url=dsn, **kw)


@pytest.fixture
def store_link(dsn: str) -> Iterator[StoreLink]:
    c = StoreLink(settings(dsn), "default")
    yield c
    c.close()


def claimed(store: Store, store_link: StoreLink) -> tuple[Claim, Guard]:
    enqueue_one(store)
    [claim] = store_link.claim(1)
    return claim, Guard(claim, store_link.settings)


def lease_of(conn: Connection, job_id: UUID) -> Any:
    row = conn.execute("SELECT visible_at AS lease_expires_at FROM jobs WHERE job_id = %s",
                       (job_id,)).fetchone()
    assert row is not None
    return row["lease_expires_at"]


def read_only(conn: Connection, dsn: str, on: bool) -> None:
    """Every new connection to the test database read-only (as on a replica), or not."""
    name = conn.info.dbname
    conn.execute(f'ALTER DATABASE "{name}" '
                 + ("SET default_transaction_read_only = on" if on
                    else "RESET default_transaction_read_only"))


def test_a_read_only_answer_is_not_committed_and_marks_the_connection_for_replacement(
        store: Store, store_link: StoreLink, conn: Connection) -> None:
    claim, _ = claimed(store, store_link)
    store_link.store.conn.execute("SET default_transaction_read_only = on")
    with pytest.raises(NotWriter) as caught:
        store_link.store.attempts.heartbeat(job_id=claim.job_id, attempt_id=claim.attempt_id,
                                           lease_seconds=60)
    assert isinstance(caught.value, StoreUnavailable)
    assert caught.value.exit_code is ExitCode.UNAVAILABLE
    assert db.stale(store_link.store.conn)


def test_a_write_refused_as_read_only_is_retried_on_a_fresh_connection(
        store: Store, store_link: StoreLink, conn: Connection) -> None:
    claim, guard = claimed(store, store_link)
    before = lease_of(conn, claim.job_id)
    first = store_link.store.conn
    first.execute("SET default_transaction_read_only = on")  # this session only
    renewed = store_link.write(guard, lambda s: s.attempts.heartbeat(
        job_id=claim.job_id, attempt_id=claim.attempt_id, lease_seconds=60))
    assert renewed is not None and renewed > before
    assert store_link.store.conn is not first and first.closed
    assert lease_of(conn, claim.job_id) == renewed


def test_a_reconnect_that_lands_on_a_read_only_server_writes_nothing_until_a_writer_answers(
        store: Store, store_link: StoreLink, conn: Connection, dsn: str) -> None:
    claim, guard = claimed(store, store_link)
    store_link.store.conn.execute("SET default_transaction_read_only = on")
    read_only(conn, dsn, True)  # every reconnect lands on "a replica" too
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(store_link.write(
        guard, lambda s: s.attempts.finish_many([TerminalWrite(
            claim.job_id, claim.attempt_id, True)]))))
    t.start()
    try:
        time.sleep(1.5)
        assert not done, "a write on a read-only server cannot have succeeded"
        status = conn.execute("SELECT status, attempt_id FROM jobs WHERE job_id = %s",
                              (claim.job_id,)).fetchone()
        assert status == {"status": "running", "attempt_id": claim.attempt_id}
    finally:
        read_only(conn, dsn, False)  # the writer is back
        t.join(timeout=30)
    assert done and done[0] is not None and claim.job_id in done[0][0]
    assert conn.execute("SELECT status FROM jobs WHERE job_id = %s",
                        (claim.job_id,)).fetchone() == {"status": "succeeded"}


def test_a_write_on_read_only_servers_until_the_lease_ends_writes_nothing(
        store: Store, dsn: str, conn: Connection) -> None:
    c = StoreLink(settings(dsn, lease_seconds=2), "default")
    try:
        claim, guard = claimed(store, c)
        read_only(conn, dsn, True)
        c.store.conn.execute("SET default_transaction_read_only = on")
        started = time.monotonic()
        assert c.write(guard, lambda s: s.attempts.finish_many([TerminalWrite(
            claim.job_id, claim.attempt_id, True)])) is None
        assert time.monotonic() - started < 2.5  # gave up with its lease, not after
    finally:
        read_only(conn, dsn, False)
        c.close()
    assert conn.execute("SELECT status FROM jobs WHERE job_id = %s",
                        (claim.job_id,)).fetchone() == {"status": "running"}


def test_a_worker_against_a_read_only_server_never_claims(
        store: Store, conn: Connection, dsn: str) -> None:
    job_id = enqueue_one(store)
    role_dsn(dsn, "worker")  # its login made while the server takes writes
    read_only(conn, dsn, True)
    try:
        done = run_cli(dsn, "worker", "--max-jobs", "1", timeout=60)
    finally:
        read_only(conn, dsn, False)
    assert done.returncode == ExitCode.UNAVAILABLE, done.stderr
    assert "takes no writes" in done.stderr
    row = conn.execute("SELECT status, attempt_count FROM jobs WHERE job_id = %s",
                       (job_id,)).fetchone()
    assert row == {"status": "pending", "attempt_count": 0}


def test_a_terminal_write_whose_backend_dies_during_commit_is_written_once(
        store: Store, store_link: StoreLink, conn: Connection) -> None:
    """A deferred trigger holds the COMMIT of the first terminal write; its backend is
    terminated there (the transaction never commits). The write is tried again on a fresh
    connection, and the job ends succeeded, with one terminal event."""
    claim, guard = claimed(store, store_link)
    conn.execute(SLOW_COMMIT)
    conn.execute("INSERT INTO public.commit_pause VALUES (1)")
    pid = store_link.store.conn.info.backend_pid

    def terminate() -> None:
        time.sleep(1.0)
        conn.execute("DELETE FROM public.commit_pause")
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

    t = threading.Thread(target=terminate)
    t.start()
    finished = store_link.finish(guard, TerminalWrite(claim.job_id, claim.attempt_id, True),
                                wants_next=False)
    t.join()
    assert finished.written
    assert store_link.store.conn.info.backend_pid != pid
    assert conn.execute("SELECT status FROM jobs WHERE job_id = %s",
                        (claim.job_id,)).fetchone() == {"status": "succeeded"}
    ends = conn.execute("SELECT count(*) AS n FROM job_events WHERE job_id = %s "
                        "AND to_status = 'succeeded'", (claim.job_id,)).fetchone()
    assert ends == {"n": 1}


def test_migrate_and_a_worker_warn_when_a_commit_may_be_acknowledged_unsafely(
        dsn: str, conn: Connection) -> None:
    """The test server runs with synchronous_commit off (fast, not durable): both say so,
    and go on."""
    conn.execute(f'ALTER DATABASE "{conn.info.dbname}" SET synchronous_commit = local')
    migrated = run_cli(dsn, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "synchronous_commit is local" in migrated.stderr
    worked = run_cli(dsn, "worker", "--max-jobs", "1")
    assert worked.returncode == 0, worked.stderr
    assert "durability_at_risk" in worked.stderr
    assert "synchronous_commit is local" in worked.stderr
