"""The database module on its own: a client-kept deadline (it hangs up, never cancels: a
cancelled wait for a synchronous standby is reported as a success), and a connection that
is safe behind a transaction pooler."""

from __future__ import annotations

import time

import pytest

from jobfence import db
from jobfence.errors import StoreUnavailable

pytestmark = pytest.mark.pooled  # directly and through PgBouncer


def test_a_deadline_hangs_up_on_the_statement_in_flight(dsn: str) -> None:
    conn = db.connect(dsn, pooler=getattr(dsn, "pooler", "none"))
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable), db.deadline(conn, 0.3):
            db.execute(conn, "SELECT pg_sleep(10)")
        assert time.monotonic() - started < 3
        assert db.stale(conn)  # its outcome unknown: the connection is replaced
    finally:
        conn.close()
    conn = db.connect(dsn, pooler=getattr(dsn, "pooler", "none"))
    try:
        # A statement done within its deadline is not hung up on late.
        with db.deadline(conn, 0.3):
            assert db.execute(conn, "SELECT 1 AS one").fetchone() == {"one": 1}
        time.sleep(0.4)
        assert db.execute(conn, "SELECT 2 AS two").fetchone() == {"two": 2}
        assert not db.stale(conn)
    finally:
        conn.close()


def test_a_statement_run_many_times_is_never_prepared_behind_a_transaction_pooler(
        dsn: str) -> None:
    conn = db.connect(dsn, pooler="transaction")
    try:
        for i in range(20):  # psycopg would prepare it after five runs
            assert db.execute(conn, "SELECT %(i)s::int AS i", {"i": i}).fetchone() == {"i": i}
        assert conn.prepare_threshold is None
    finally:
        conn.close()
