"""Through a real PgBouncer in transaction mode (a server connection lent per transaction):
draining workers keep the promise, every periodic function runs one pass at a time and
never locks itself out, SIGTERM stops a pass cleanly, `migrate` races harmlessly, and a
pooler that is full queues the work while one that refuses is a clear exit 4."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from devtools.pgbouncer import PgBouncer
from devtools.roles import login_name
from devtools.sqlconn import connect
from jobfence import db
from jobfence.db import Connection
from jobfence.store import Store
from jobfence.store.migrations import available
from jobfence.store.roles import KINDS
from tests.support import JOBFENCE, REPO, Dsn, cli_env, run_cli, through
from tests.support.factories import new_job
from tests.support.pg import Databases, with_db
from tests.support.procs import spawn, wait_for


@pytest.fixture
def route() -> str:
    """Every test database of this module is reached through the session's PgBouncer."""
    return "pgbouncer"


FUNCTIONS = ("sweeper", "lifecycle", "export-finalize", "reconciliation", "orphan-cleanup")
# Reconciliation and orphan-cleanup compare the claims with this machine's worker processes.
LOCAL = {"JOBFENCE_CLUSTER": "local"}
NOOP = {"actions": [{"name": "sleep", "params": {"seconds": 0}}]}


def runs(dsn: Dsn, function: str) -> list[dict[str, Any]]:
    with connect(dsn.direct) as conn:
        return conn.execute("SELECT status, error FROM function_runs WHERE function = %s "
                            "ORDER BY run_id", (function,)).fetchall()


@contextmanager
def jobs_locked(dsn: Dsn) -> Iterator[Connection]:
    """Hold an exclusive lock on the jobs table (as a long migration or a stuck statement
    would): a pass that reaches its first batch waits there, inside its statement."""
    conn = connect(dsn.direct)
    try:
        with conn.transaction():
            conn.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            yield conn
    finally:
        conn.close()


def waiting_on_a_lock(dsn: Dsn) -> int:
    with connect(dsn.direct) as conn:
        row = conn.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE datname = "
                           "current_database() AND wait_event_type = 'Lock'").fetchone()
    return int(row["n"]) if row else 0


def test_four_draining_workers_finish_200_jobs_each_exactly_once(dsn: Dsn) -> None:
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps([NOOP] * 200))
    assert r.returncode == 0, r.stderr
    workers = [spawn(dsn, "worker", "--max-jobs", "200") for _ in range(4)]
    for w in workers:
        _, err = w.communicate(timeout=180)
        assert w.returncode == 0, err[-3000:]
    with connect(dsn.direct) as conn:
        row = conn.execute("""
            SELECT count(*) FILTER (WHERE status = 'succeeded' AND attempt_count = 1) AS once,
                   count(DISTINCT attempt_id) AS fences FROM jobs""").fetchone()
        claims = conn.execute("SELECT count(*) AS n FROM job_events "
                              "WHERE to_status = 'running'").fetchone()
    assert row == {"once": 200, "fences": 200}
    assert claims == {"n": 200}


@pytest.mark.parametrize("function", FUNCTIONS)
def test_ten_passes_in_a_row_all_run_and_leave_nothing_held(dsn: Dsn, function: str) -> None:
    for _ in range(10):
        r = run_cli(dsn, function, **LOCAL)
        assert r.returncode == 0, r.stderr
        assert "skipped" not in json.loads(r.stdout)
    assert [x["status"] for x in runs(dsn, function)] == ["succeeded"] * 10
    with connect(dsn.direct) as conn:
        assert conn.execute("SELECT count(*) AS n FROM function_leases").fetchone() == {"n": 0}
        assert conn.execute("SELECT count(*) AS n FROM pod_snapshots").fetchone() == {"n": 0}
        assert conn.execute("SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'"
                            ).fetchone() == {"n": 0}


@pytest.mark.parametrize("function", FUNCTIONS)
def test_two_passes_at_the_same_moment_one_runs_the_other_skips(dsn: Dsn,
                                                                function: str) -> None:
    with jobs_locked(dsn):
        passes = [spawn(dsn, function, **LOCAL) for _ in range(2)]
        # The one that got the lease waits for the jobs table; the other skips at once.
        first = wait_for(lambda: next((p for p in passes if p.poll() is not None), None))
        out, err = first.communicate()
        assert first.returncode == 0, err
        assert json.loads(out) == {"function": function, "skipped": True}
    [other] = [p for p in passes if p is not first]
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    assert "skipped" not in json.loads(out)
    assert sorted(x["status"] for x in runs(dsn, function)) == ["skipped", "succeeded"]


def test_a_pass_killed_mid_run_frees_its_function_once_its_lease_runs_out(dsn: Dsn) -> None:
    lease = {"JOBFENCE_FUNCTION_LEASE_SECONDS": "3"}
    with jobs_locked(dsn):
        killed = spawn(dsn, "sweeper", **lease)
        wait_for(lambda: waiting_on_a_lock(dsn))
        killed.send_signal(signal.SIGKILL)
        killed.communicate()
    killed_at = time.monotonic()

    def next_pass_ran() -> bool:
        r = run_cli(dsn, "sweeper", **lease)
        assert r.returncode == 0, r.stderr
        return "skipped" not in json.loads(r.stdout)

    wait_for(next_pass_ran, timeout=15, interval=0.2)
    assert time.monotonic() - killed_at < 3 + 5
    statuses = runs(dsn, "sweeper")
    assert statuses[0]["status"] == "interrupted"  # found abandoned by the run that took over
    assert "abandoned" in statuses[0]["error"]
    assert statuses[-1]["status"] == "succeeded"


@pytest.mark.parametrize("function", FUNCTIONS)
def test_sigterm_mid_pass_stops_within_2s_and_records_the_run_interrupted(
        dsn: Dsn, store: Store, function: str) -> None:
    # Claims whose lease ran out: the sweeper's batch would reclaim them.
    for _ in range(3):
        store.jobs.enqueue([new_job()])
    store.attempts.claim(worker_id="gone", lease_seconds=0.2, limit=3)
    time.sleep(0.3)
    with connect(dsn.direct) as conn:
        before = conn.execute("SELECT job_id, status, attempt_id FROM jobs ORDER BY job_id"
                              ).fetchall()
    with jobs_locked(dsn):
        p = spawn(dsn, function, **LOCAL)
        wait_for(lambda: waiting_on_a_lock(dsn))  # inside its statement
        sent = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=10)
        took = time.monotonic() - sent
    assert p.returncode == 1, err
    assert took < 2.0, took
    assert "interrupted" in err and "Traceback" not in err
    [run] = runs(dsn, function)
    assert run["status"] == "interrupted" and "SIGTERM" in run["error"]
    with connect(dsn.direct) as conn:
        # The batch in flight rolled back whole; the function is free for the next pass.
        assert conn.execute("SELECT job_id, status, attempt_id FROM jobs ORDER BY job_id"
                            ).fetchall() == before
        assert conn.execute("SELECT count(*) AS n FROM function_leases").fetchone() == {"n": 0}
    r = run_cli(dsn, function, **LOCAL)
    assert r.returncode == 0 and "skipped" not in json.loads(r.stdout), r.stderr


def test_migrate_from_three_processes_at_once_through_the_pooler(
        databases: Databases, pgbouncer: PgBouncer) -> None:
    url = databases.create(migrated=False)
    route = through(pgbouncer, url)
    try:
        procs = [subprocess.Popen([*JOBFENCE, "migrate"], env=cli_env(route), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
        reports = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            reports.append(json.loads(out))
        applied = [m for r in reports for m in r["applied"]]
        assert sorted(applied) == sorted(f"{m.version:04d}_{m.name}" for m in available())
        assert {r["version"] for r in reports} == {len(available())}
        assert len({r["installation"] for r in reports}) == 1
    finally:
        databases.drop(url)


@pytest.fixture
def small_pool(pg_server: tuple[str, Any]) -> Iterator[PgBouncer]:
    with PgBouncer(pg_server[0], pool_mode="transaction", default_pool_size=10,
                   users=[login_name("jobfence", kind) for kind in KINDS],
                   max_client_conn=400) as bouncer:
        yield bouncer


def test_300_clients_through_a_pool_of_10_server_connections(
        dsn: Dsn, small_pool: PgBouncer) -> None:
    route = through(small_pool, dsn.direct)
    clients = 300
    opened = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def client() -> None:
        try:
            conn = db.connect(route, pooler="transaction", connect_timeout=30)
        except BaseException as exc:
            errors.append(exc)
            opened.abort()
            raise
        try:
            opened.wait(timeout=120)  # all 300 are connected at once
            store = Store(conn)
            [t] = store.jobs.enqueue([new_job()])
            row = store.jobs.get(t.job_id)
            assert row is not None
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    opened.wait(timeout=120)
    workers = [spawn(route, "worker", "--max-jobs", str(clients), "--max-seconds", "120")
               for _ in range(2)]
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    for w in workers:
        _, err = w.communicate(timeout=180)
        assert w.returncode == 0, err[-3000:]

    with connect(dsn.direct) as conn:
        # Whatever the workers' draining left (a job enqueued after they looked last).
        left = conn.execute("SELECT count(*) AS n FROM jobs WHERE status <> 'succeeded'"
                            ).fetchone()
    if left and left["n"]:
        w = spawn(route, "worker", "--max-jobs", str(clients))
        assert w.wait(timeout=120) == 0
    with connect(dsn.direct) as conn:
        assert conn.execute("SELECT count(*) FILTER (WHERE status = 'succeeded') AS ok, "
                            "count(*) AS n FROM jobs").fetchone() == {"ok": clients,
                                                                      "n": clients}


@pytest.mark.parametrize("args", [("status", "00000000-0000-0000-0000-000000000001"),
                                  ("worker",), ("sweeper",), ("migrate",)],
                         ids=lambda a: a[0])
def test_a_pooler_that_refuses_the_connection_is_exit_4(
        dsn: Dsn, pg_server: tuple[str, Any], args: tuple[str, ...]) -> None:
    dbname = conninfo_to_dict(dsn.direct)["dbname"]
    with PgBouncer(pg_server[0], max_client_conn=2) as full:
        route = with_db(full.url("postgres"), dbname)
        held = [db.connect(route, pooler="transaction") for _ in range(2)]
        try:
            r = run_cli(route, *args, JOBFENCE_DATABASE_POOLER="transaction")
        finally:
            for c in held:
                c.close()
    assert r.returncode == 4, r.stderr
    assert "database unavailable" in r.stderr and "no more connections allowed" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
