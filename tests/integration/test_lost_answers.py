"""A claim or an enqueue whose answer is lost, and a claim riding on a terminal write, on
a real PostgreSQL. The answer is lost the way a network loses it: the client's socket is shut for
reading while the server is still committing (a deferred trigger holds the COMMIT), so the
claim commits and its answer never arrives. Its jobs are given back by the claim's name as
soon as the database answers again — pending, their attempts not spent — not held unrun
until their leases end. A claim that rides on a terminal write is guarded from the moment
it arrives: its lease is renewed while the job before it finishes (a datum's parent
finalized, S3 I/O), instead of running out unwatched. An enqueue whose answer is lost is
read back on a fresh connection and sent again only if it had not committed: one job,
whichever way it went."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import pytest

from jobfence import cli
from jobfence.console import api as console_api
from jobfence.db import Connection
from jobfence.errors import StoreUnavailable
from jobfence.settings import Settings
from jobfence.spec import parse_specs
from jobfence.store import Store, TerminalWrite
from jobfence.submit import submit
from jobfence.worker import execution
from jobfence.worker import store_link as store_link_module
from jobfence.worker.guard import Guard
from jobfence.worker.loop import Worker
from jobfence.worker.store_link import StoreLink
from tests.support import lose_next_answer
from tests.support.api_client import api_client
from tests.support.factories import enqueue_one

LOST = "the answer to its claim was lost"


@pytest.fixture
def store_link(dsn: str) -> Iterator[StoreLink]:
    c = StoreLink(Settings(database_url=dsn, lease_seconds=60, worker_id="w-lost"), "default")
    yield c
    c.close()


def wait_for(ok: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not ok():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.2)


def job_row(conn: Connection, job_id: UUID) -> dict[str, Any]:
    row = conn.execute("SELECT status, attempt_count, attempt_id, claimed_by, reason "
                       "FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def events(conn: Connection, job_id: UUID) -> list[tuple[str, str, str]]:
    return [(r["from_status"], r["to_status"], r["reason"]) for r in conn.execute(
        "SELECT from_status, to_status, reason FROM job_events WHERE job_id = %s "
        "ORDER BY event_id", (job_id,)).fetchall()]


def test_the_jobs_of_a_claim_whose_answer_was_lost_are_given_back_unspent(
        store: Store, conn: Connection, store_link: StoreLink) -> None:
    job = enqueue_one(store, max_attempts=1)
    cut = lose_next_answer(conn, store_link.store)
    with pytest.raises(StoreUnavailable):
        store_link.claim(1)
    cut.join()
    # The claim commits after its answer was lost (the worker's first give-back, at once,
    # found it still committing): the job is held by an attempt nobody knows ...
    wait_for(lambda: job_row(conn, job)["status"] == "running")
    # ... until the worker's next use of its connection asks again (at most once a second).
    wait_for(lambda: store_link.read(lambda s: None) is None
             and job_row(conn, job)["status"] == "pending")
    row = job_row(conn, job)
    assert (row["status"], row["attempt_count"], row["attempt_id"]) == ("pending", 0, None)
    assert LOST in row["reason"]
    assert [e[:2] for e in events(conn, job)][-2:] == [("pending", "running"),
                                                        ("running", "pending")]
    # Its one attempt is still there to spend: it is claimed and runs.
    [claim] = store_link.claim(1)
    assert (claim.job_id, claim.attempt_count) == (job, 1)


def test_a_claim_riding_on_a_batch_whose_answer_was_lost_is_given_back(
        store: Store, conn: Connection, store_link: StoreLink) -> None:
    first = enqueue_one(store)
    [claim] = store_link.claim(1)
    second = enqueue_one(store, max_attempts=1)
    guard = Guard(claim, store_link.settings)
    cut = lose_next_answer(conn, store_link.store)
    done = store_link.finish(guard, TerminalWrite(first, claim.attempt_id, True),
                            wants_next=True)
    cut.join()
    assert done.written and done.next_claim is None  # its write resolved, its claim lost
    assert job_row(conn, first)["status"] == "succeeded"
    row = job_row(conn, second)
    assert (row["status"], row["attempt_count"]) == ("pending", 0), row
    assert LOST in row["reason"]


def test_a_claim_that_never_committed_leaves_nothing_to_give_back(
        store: Store, conn: Connection, store_link: StoreLink) -> None:
    """The claim's backend dies during its COMMIT: the give-back matches nothing, and no
    other claim of the same worker is touched."""
    held = enqueue_one(store)
    [mine] = store_link.claim(1)
    waiting = enqueue_one(store)
    cut = lose_next_answer(conn, store_link.store, abort=True)
    with pytest.raises(StoreUnavailable):
        store_link.claim(1)
    cut.join()
    store_link.read(lambda s: None)
    assert job_row(conn, waiting)["status"] == "pending"
    row = job_row(conn, held)
    assert (row["status"], row["attempt_id"]) == ("running", mine.attempt_id)


def test_a_riding_claim_is_guarded_while_the_job_before_it_finishes(
        dsn: str, store: Store, conn: Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first job's parent finalization takes longer than a whole lease: the second job,
    claimed with the first job's terminal write, keeps its lease (renewed by the guards)
    and runs to its end; unguarded it would have self-fenced before it started."""
    first = enqueue_one(store)
    second = enqueue_one(store)
    finalize = execution.Execution._finalize_parent
    slow: list[UUID] = []

    def slow_finalize(self: execution.Execution) -> None:
        if not slow:
            slow.append(self.claim.job_id)
            time.sleep(4.5)
        finalize(self)

    monkeypatch.setattr(execution.Execution, "_finalize_parent", slow_finalize)
    report = Worker(Settings(database_url=dsn, lease_seconds=3)).run(2)
    assert slow == [first]
    assert (report.claimed, report.succeeded, report.lost) == (2, 2, 0), report
    row = job_row(conn, second)
    assert (row["status"], row["attempt_count"]) == ("succeeded", 1)


@pytest.mark.parametrize("abort", [False, True], ids=["committed", "never-committed"])
def test_an_enqueue_whose_answer_was_lost_makes_one_job(
        dsn: str, conn: Connection, abort: bool) -> None:
    settings = Settings(database_url=dsn)
    first = cli.connect_store(settings, "enqueue")
    cut = lose_next_answer(conn, first, abort=abort)
    try:
        [made] = submit(settings, first, parse_specs({"actions": [
            {"name": "sleep", "params": {"seconds": 0}}]}),
            reopen=lambda: cli.connect_store(settings, "enqueue"))
    finally:
        cut.join()
        first.conn.close()
    rows = conn.execute("SELECT job_id, status FROM jobs").fetchall()
    assert rows == [{"job_id": made.job_id, "status": "pending"}]


class Said:
    """The store_link's log lines, as (event, keywords)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def _say(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))

    info = warning = error = _say

    def of(self, event: str) -> list[dict[str, Any]]:
        return [kw for e, kw in list(self.lines) if e == event]


def test_a_forced_exit_says_which_outcomes_it_leaves_unknown(
        dsn: str, store: Store, conn: Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminal write's answer is lost and the database then stops answering: the worker
    retries while its lease holds. Forced out meanwhile (SIGTERM, and an action that would
    not stop), it says which outcome it leaves to the lease; kept alive, the read-back
    gives up after a lease and says that instead — never silence."""
    said = Said()
    monkeypatch.setattr(store_link_module, "log", said)
    c = StoreLink(Settings(database_url=dsn, lease_seconds=3, worker_id="w-left"), "default")
    job = enqueue_one(store)
    [claim] = c.claim(1)
    guard = Guard(claim, c.settings)
    cut = lose_next_answer(conn, c.store)

    def unreachable() -> Store:
        raise StoreUnavailable("database unavailable: cut off by the test")

    monkeypatch.setattr(c, "_connect", unreachable)
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(
        c.finish(guard, TerminalWrite(job, claim.attempt_id, True), False)), daemon=True)
    t.start()
    cut.join()
    wait_for(lambda: bool(said.of("write_retry")))
    c.leave()
    mine = {"job_id": str(job), "attempt_id": str(claim.attempt_id)}
    assert [{k: e[k] for k in mine} for e in said.of("outcome_unknown")] == [mine]
    assert [{k: e[k] for k in mine} for e in said.of("outcome_left")] == [mine]
    t.join(15)
    assert not t.is_alive()
    assert [{k: e[k] for k in mine} for e in said.of("outcome_unresolved")] == [mine]
    assert done[0].written is False and not said.of("outcome_resolved")
    # The first try did commit: the job is the attempt's, whatever the worker could tell.
    assert job_row(conn, job)["status"] == "succeeded"
    c.close()


@pytest.mark.parametrize("abort", [False, True], ids=["committed", "never-committed"])
def test_an_http_submit_whose_answer_was_lost_makes_one_job(
        dsn: str, conn: Connection, abort: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``POST /api/v1/jobs`` on a pooled connection whose answer is lost: found out on a
    connection of its own, answered 202 with the one job there is."""
    real = console_api.submit
    cuts: list[threading.Thread] = []

    def losing(settings: Settings, store: Store, *a: Any, **kw: Any) -> Any:
        if not cuts:
            cuts.append(lose_next_answer(conn, store, abort=abort))
        return real(settings, store, *a, **kw)

    monkeypatch.setattr(console_api, "submit", losing)
    try:
        with api_client(dsn) as client:
            r = client.post("/api/v1/jobs", json={"actions": [
                {"name": "sleep", "params": {"seconds": 0}}]})
    finally:
        for cut in cuts:
            cut.join()
    assert r.status_code == 202, r.text
    rows = conn.execute("SELECT job_id, status FROM jobs").fetchall()
    assert rows == [{"job_id": UUID(r.json()["job_id"]), "status": "pending"}]


def test_a_worker_that_stops_on_a_lost_claim_gives_its_jobs_back_first(
        dsn: str, store: Store, conn: Connection) -> None:
    """A worker with nothing in hand whose claim's answer is lost stops (exit 4: the
    database did not answer), but not before the jobs that claim took are given back —
    not held unrun until their leases end, an attempt spent."""
    job = enqueue_one(store, max_attempts=1)
    worker = Worker(Settings(database_url=dsn, lease_seconds=60))
    cut = lose_next_answer(conn, worker.wiring.store_link.store)
    try:
        with pytest.raises(StoreUnavailable):
            worker.run(1)
    finally:
        cut.join()
    row = job_row(conn, job)
    assert (row["status"], row["attempt_count"], row["attempt_id"]) == ("pending", 0, None)
    assert LOST in row["reason"]
