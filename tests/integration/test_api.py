"""The Python API (``jobfence.api``) on an application's own connection, in its own
transaction, against the real server — as the operator role's login, directly and through
PgBouncer in transaction mode."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import namedtuple_row, tuple_row

import jobfence
from jobfence.spec import JobSpec
from jobfence.store import Store
from tests.support import Dsn, role_dsn, run_cli
from tests.support.factories import new_job

SLEEP = [{"name": "sleep", "params": {"seconds": 0}}]


def app_connect(dsn: Dsn, **kw: Any) -> psycopg.Connection[Any]:
    """The application's own connection: the operator's login, psycopg's defaults (tuple
    rows, not autocommit) unless asked otherwise; nothing prepared behind a pooler."""
    url = role_dsn(dsn, "enqueue")
    conn = psycopg.connect(url, **kw)
    if dsn.pooler == "transaction":
        conn.prepare_threshold = None
    return conn


@pytest.fixture
def app(dsn: Dsn, conn: Any) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit application connection, with the application's own table."""
    login = str(psycopg.conninfo.conninfo_to_dict(role_dsn(dsn, "enqueue"))["user"])
    conn.execute("CREATE SCHEMA app")
    conn.execute("CREATE TABLE app.requests (id serial PRIMARY KEY, job_id uuid, what text)")
    conn.execute(f'GRANT USAGE ON SCHEMA app TO "{login}"')
    conn.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA app TO "{login}"')
    conn.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA app TO "{login}"')
    c = app_connect(dsn, autocommit=True)
    yield c
    c.close()


def counts(conn: Any) -> dict[str, int]:
    row = conn.execute("""
        SELECT (SELECT count(*) FROM jobs) AS jobs,
               (SELECT count(*) FROM job_events) AS events,
               (SELECT count(*) FROM job_dependencies) AS dependencies,
               (SELECT count(*) FROM jobs
                 WHERE resource IS NOT NULL
                   AND status NOT IN ('succeeded', 'failed', 'cancelled')) AS held,
               (SELECT count(*) FROM app.requests) AS requests""").fetchone()
    return dict(row)


@pytest.mark.pooled
def test_a_rolled_back_transaction_leaves_nothing_and_a_committed_one_exactly_one_of_each(
        app: psycopg.Connection[Any], conn: Any, store: Store) -> None:
    before = jobfence.enqueue(app, {"actions": SLEEP})[0]  # a dependency, committed
    empty = counts(conn)
    spec = {"actions": SLEEP, "resource": "db.orders", "after": [before["job_id"]]}
    with pytest.raises(RuntimeError, match="the application failed"), app.transaction():
        app.execute("INSERT INTO app.requests (what) VALUES ('compact db.orders')")
        [job] = jobfence.enqueue(app, spec)
        app.execute("UPDATE app.requests SET job_id = %s", (job["job_id"],))
        raise RuntimeError("the application failed after enqueueing")
    assert counts(conn) == empty
    assert store.jobs.get(UUID(job["job_id"])) is None

    with app.transaction():
        app.execute("INSERT INTO app.requests (what) VALUES ('compact db.orders')")
        [job] = jobfence.enqueue(app, spec)
        app.execute("UPDATE app.requests SET job_id = %s", (job["job_id"],))
        # Not visible to anyone else until the application commits.
        assert store.jobs.get(UUID(job["job_id"])) is None
    after = counts(conn)
    assert {k: after[k] - empty[k] for k in after} == {
        "jobs": 1, "events": 1, "dependencies": 1, "held": 1, "requests": 1}
    [mine] = [r["job_id"] for r in conn.execute("SELECT job_id FROM app.requests").fetchall()]
    assert str(mine) == job["job_id"]
    assert job["status"] == "waiting"  # on its dependency, which has not run


@pytest.mark.pooled
def test_a_refusal_inside_the_callers_transaction_leaves_it_usable(
        app: psycopg.Connection[Any], conn: Any) -> None:
    jobfence.enqueue(app, {"actions": SLEEP, "resource": "db.busy"})
    with app.transaction():
        app.execute("INSERT INTO app.requests (what) VALUES ('first')")
        with pytest.raises(jobfence.ResourceBusy):
            jobfence.enqueue(app, {"actions": SLEEP, "resource": "db.busy"})
        with pytest.raises(jobfence.InvalidSpec, match="actions"):
            jobfence.enqueue(app, {"actions": []})
        with pytest.raises(jobfence.JobNotFound):
            jobfence.enqueue(app, {"actions": SLEEP, "after": [str(UUID(int=1))]})
        app.execute("INSERT INTO app.requests (what) VALUES ('second')")  # still usable
    assert [r["what"] for r in conn.execute(
        "SELECT what FROM app.requests ORDER BY id").fetchall()] == ["first", "second"]
    assert counts(conn)["jobs"] == 1


@pytest.mark.pooled
def test_a_spec_that_would_expire_before_it_may_start_is_refused_and_writes_nothing(
        app: psycopg.Connection[Any], conn: Any) -> None:
    empty = counts(conn)
    for when in ({"delay": "PT1H"}, {"run_at": (datetime.now(UTC) + timedelta(hours=2)
                                                ).isoformat()}):
        with pytest.raises(jobfence.InvalidSpec, match="expire before it may start"):
            jobfence.enqueue(app, {"actions": SLEEP, "expires_in": "PT1H", **when})
    assert counts(conn) == empty


def test_the_database_refuses_an_expiry_before_the_start_by_its_own_clock(
        app: psycopg.Connection[Any], conn: Any) -> None:
    """``expires_in`` counts from the database's ``now()``: the start of the application's
    transaction, which may be long before the spec was checked by the application's clock.
    The database checks again, and the refusal leaves the transaction usable."""
    with app.transaction():
        app.execute("INSERT INTO app.requests (what) VALUES ('first')")  # now() is fixed
        time.sleep(1.5)
        soon = datetime.now(UTC) + timedelta(seconds=1)  # after now() + PT2S
        with pytest.raises(jobfence.InvalidSpec, match="expire before it may start"):
            jobfence.enqueue(app, {"actions": SLEEP, "run_at": soon.isoformat(),
                                   "expires_in": "PT2S"})
        app.execute("INSERT INTO app.requests (what) VALUES ('second')")
    assert counts(conn)["jobs"] == 0 and counts(conn)["requests"] == 2


@pytest.mark.pooled
@pytest.mark.usefixtures("app")
def test_the_store_refuses_a_job_that_would_expire_before_it_may_start(
        store: Store, conn: Any) -> None:
    empty = counts(conn)
    later = datetime.now(UTC) + timedelta(hours=1)
    for job in (new_job(delay_seconds=3600, expires_in_seconds=60),
                new_job(run_at=later, expires_in_seconds=60),
                new_job(delay_seconds=60, expires_in_seconds=60)):
        with pytest.raises(jobfence.InvalidSpec, match="expire before it may start"):
            store.jobs.enqueue([new_job(), job])  # all or nothing
    assert counts(conn) == empty
    store.jobs.enqueue([new_job(delay_seconds=60, expires_in_seconds=61)])


def test_a_connection_not_in_autocommit_is_committed_and_rolled_back_by_the_application(
        dsn: Dsn, app: psycopg.Connection[Any], conn: Any) -> None:
    plain = app_connect(dsn)  # psycopg's default: not autocommit
    try:
        jobfence.enqueue(plain, [{"actions": SLEEP}, {"actions": SLEEP}])
        plain.rollback()
        assert counts(conn)["jobs"] == 0
        jobfence.enqueue(plain, {"actions": SLEEP})
        assert counts(conn)["jobs"] == 0  # nothing committed behind the application's back
        plain.commit()
        assert counts(conn)["jobs"] == 1
    finally:
        plain.close()


def test_concurrent_transactions_on_one_resource_have_exactly_one_winner(
        dsn: Dsn, app: psycopg.Connection[Any], conn: Any) -> None:
    """Eight applications enqueue on one resource at once, each in its own transaction,
    holding it open a moment: the database's unique index lets exactly one commit."""
    n = 8
    start = threading.Barrier(n)
    outcomes: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        c = app_connect(dsn, autocommit=True)
        try:
            start.wait()
            with c.transaction():
                c.execute("INSERT INTO app.requests (what) VALUES (%s)", (f"app {i}",))
                jobfence.enqueue(c, {"actions": SLEEP, "resource": "db.contended"})
                c.execute("SELECT pg_sleep(0.2)")
            outcome = "committed"
        except jobfence.ResourceBusy:
            outcome = "busy"
        finally:
            c.close()
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["busy"] * (n - 1) + ["committed"]
    # The losers' own rows rolled back with their transactions.
    assert counts(conn)["requests"] == 1 and counts(conn)["jobs"] == 1


@pytest.mark.pooled
def test_the_callers_session_is_left_as_it_was(dsn: Dsn, app: psycopg.Connection[Any]) -> None:
    for factory in (tuple_row, namedtuple_row):
        c = app_connect(dsn, autocommit=True, row_factory=factory)
        try:
            with c.transaction():
                c.execute("SET LOCAL search_path TO app, public")
                [job] = jobfence.enqueue(c, {"actions": SLEEP})
                assert c.execute("SHOW search_path").fetchone()[0] == "app, public"
                assert jobfence.status(c, job["job_id"])["status"] == "pending"
                assert jobfence.cancel(c, job["job_id"])["status"] == "cancelled"
                assert c.execute("SHOW search_path").fetchone()[0] == "app, public"
            assert c.row_factory is factory and c.autocommit is True
            assert c.prepare_threshold == (None if dsn.pooler == "transaction" else 5)
            row = c.execute("SELECT 1 AS one").fetchone()
            assert row == (1,) and (factory is tuple_row or row.one == 1)
        finally:
            c.close()


def test_answers_are_the_clis_objects(dsn: Dsn, app: psycopg.Connection[Any]) -> None:
    [job] = jobfence.enqueue(app, JobSpec.model_validate(
        {"actions": SLEEP, "labels": {"team": "a"}, "idempotency_key": "k-1"}))
    assert set(job) == {"job_id", "status"}
    [again] = jobfence.enqueue(app, {"actions": SLEEP, "labels": {"team": "a"},
                                     "idempotency_key": "k-1"})
    assert again == {**job, "created": False}
    r = run_cli(dsn, "status", job["job_id"], "-o", "json")
    assert r.returncode == 0, r.stderr
    assert jobfence.status(app, UUID(job["job_id"])) == json.loads(r.stdout)
    with_events = jobfence.status(app, job["job_id"], events=True)
    assert [e["to_status"] for e in with_events["events"]] == ["pending"]
    assert jobfence.cancel(app, job["job_id"], reason="not needed") == {
        "job_id": job["job_id"], "status": "cancelled", "children_cancelled": 0}
    with pytest.raises(jobfence.JobAlreadyTerminal):
        jobfence.cancel(app, job["job_id"])
    with pytest.raises(jobfence.JobNotFound):
        jobfence.status(app, str(UUID(int=7)))
    with pytest.raises(jobfence.InvalidSpec, match="not a job id"):
        jobfence.status(app, "nope")


def test_drain_schema_and_closed_connections(dsn: Dsn, app: psycopg.Connection[Any],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli(dsn, "drain", "on").returncode == 0
    with pytest.raises(jobfence.Drained):
        jobfence.enqueue(app, {"actions": SLEEP})
    assert run_cli(dsn, "drain", "off").returncode == 0
    monkeypatch.setenv("JOBFENCE_SCHEMA", "elsewhere")
    with pytest.raises(jobfence.NotMigrated):  # that installation's schema does not exist
        jobfence.enqueue(app, {"actions": SLEEP})
    assert jobfence.enqueue(app, {"actions": SLEEP}, schema="jobfence")[0]["status"]
    with pytest.raises(jobfence.InvalidSpec, match="schema"):
        jobfence.enqueue(app, {"actions": SLEEP}, schema="Bad-Name")
    closed = app_connect(dsn)
    closed.close()
    with pytest.raises(jobfence.StoreUnavailable, match="closed"):
        jobfence.enqueue(closed, {"actions": SLEEP})
    with pytest.raises(TypeError, match=r"psycopg\.Connection"):
        jobfence.enqueue(object(), {"actions": SLEEP})
    failed = app_connect(dsn)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero):
            failed.execute("SELECT 1/0")
        with pytest.raises(jobfence.StoreError, match="roll it back"):
            jobfence.enqueue(failed, {"actions": SLEEP})
    finally:
        failed.close()


def test_inputs_are_listed_first_and_the_transaction_holds_parent_and_children(
        dsn: Dsn, app: psycopg.Connection[Any], conn: Any, s3_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from jobfence.adapters.s3 import S3ObjectStore

    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    s3 = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"])
    bucket = s3_env["JOBFENCE_S3_BUCKET"]
    for i in range(5):
        s3.put_bytes(bucket, f"api-in/part-{i}.txt", b"x")
    spec = {"actions": [{"name": "command", "params": {"argv": ["true"]}}],
            "inputs": f"s3://{bucket}/api-in/"}
    with pytest.raises(RuntimeError), app.transaction():
        [parent] = jobfence.enqueue(app, spec)
        assert parent["children"] == 5
        raise RuntimeError("rolled back")
    assert counts(conn)["jobs"] == 0
    with app.transaction():
        [parent] = jobfence.enqueue(app, spec)
    assert counts(conn)["jobs"] == 6
    assert jobfence.status(app, parent["job_id"])["children"]["pending"] == 5
    with pytest.raises(jobfence.NotFound):
        jobfence.enqueue(app, {**spec, "inputs": "s3://no-such-bucket/x/"})


def test_a_workflow_in_the_applications_transaction(dsn: Dsn, app: psycopg.Connection[Any],
                                                    conn: Any) -> None:
    """A workflow enqueued in the application's transaction: gone with its rollback, all of
    it there with its commit (the operator's login), answered as the CLI answers it."""
    wf = {"workflow": "signup", "steps": {"welcome": {"actions": SLEEP},
                                          "follow-up": {"actions": SLEEP,
                                                        "after": ["welcome"]}}}
    with app.transaction(force_rollback=True):
        jobfence.enqueue(app, wf)
    assert conn.execute("SELECT count(*) AS n FROM workflows").fetchone()["n"] == 0
    [made] = jobfence.enqueue(app, wf)
    assert set(made) == {"workflow_id", "workflow", "steps"}
    assert {k: v["status"] for k, v in made["steps"].items()} == {
        "welcome": "pending", "follow-up": "waiting"}
    assert conn.execute("SELECT count(*) AS n FROM jobs WHERE workflow_id = %s",
                        (made["workflow_id"],)).fetchone()["n"] == 2
