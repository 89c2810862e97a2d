"""The worker's state machine, in process, on a real database, with test actions from the
plugin registry (tests/fixtures/plugin): success; the next claim riding on a terminal
write; a failing action retried with backoff, then failed; a retry resuming at action 2;
a run timeout; a fence lost in the middle of an action; a claim refused at the terminal
write; nothing ready — and, where it means something, the same with many jobs at once (one
job's fence lost while the others finish). Signals and crashes are left to the acceptance
tests (a subprocess is what they hit)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from jobfence import db
from jobfence.db import Connection
from jobfence.settings import Settings
from jobfence.store import ClaimRequest, Store
from jobfence.store.attempts import Attempts
from jobfence.worker.loop import Report, Worker
from tests.support.factories import enqueue_one, plugin_installed


@pytest.fixture(autouse=True)
def plugin() -> Iterator[Any]:
    with plugin_installed():
        import jobfence_test_actions as actions

        actions.CALLS.clear()
        actions.HOOKS.clear()
        actions.FailFirst.seen.clear()
        yield actions


def settings(dsn: str, **kw: Any) -> Settings:
    kw.setdefault("lease_seconds", 30)
    kw.setdefault("retry_base_seconds", 0.05)
    kw.setdefault("stop_check_seconds", 0.1)
    return Settings(database_url=dsn, database_pooler=getattr(dsn, "pooler", "none"), **kw)


def run(dsn: str, *, max_jobs: int = 100, concurrency: int = 1, idle: float = 0.0,
        **kw: Any) -> Report:
    return Worker(settings(dsn, **kw), concurrency=concurrency).run(max_jobs,
                                                                    idle_seconds=idle)


def job(store: Store, *actions: tuple[str, dict[str, Any]], **kw: Any) -> UUID:
    return enqueue_one(store, actions=[{"name": n, "params": p} for n, p in actions], **kw)


def events(conn: Connection, job_id: UUID) -> list[tuple[str | None, str, str | None]]:
    return [(r["from_status"], r["to_status"], r["reason"]) for r in conn.execute(
        "SELECT from_status, to_status, reason FROM job_events WHERE job_id = %s "
        "ORDER BY event_id", (job_id,))]


def row(conn: Connection, job_id: UUID) -> dict[str, Any]:
    found = conn.execute("SELECT * FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert found is not None
    return found


def test_a_job_succeeds(dsn: str, store: Store, conn: Connection) -> None:
    j = job(store, ("shout", {"text": "hi"}))
    report = run(dsn)
    assert (report.claimed, report.succeeded, report.ok) == (1, 1, True)
    assert report.stopped_by == "nothing_ready"
    assert [e[1] for e in events(conn, j)] == ["pending", "running", "succeeded"]
    [result] = store.jobs.action_results([j])
    assert result.result["shouted"] == "HI"


def test_the_next_claim_rides_on_the_terminal_write(dsn: str, store: Store,
                                                    conn: Connection) -> None:
    jobs = [job(store, ("shout", {"text": str(i)})) for i in range(3)]
    report = run(dsn)
    assert (report.claimed, report.succeeded) == (3, 3)
    rows = sorted((row(conn, j) for j in jobs), key=lambda r: r["claimed_at"])
    # One transaction: the terminal write's now() is the next claim's now().
    assert rows[0]["finished_at"] == rows[1]["claimed_at"]
    assert rows[1]["finished_at"] == rows[2]["claimed_at"]


def test_a_failing_action_is_retried_with_backoff_then_failed(
        dsn: str, store: Store, conn: Connection) -> None:
    j = job(store, ("fail", {"message": "no disk"}), max_attempts=3)
    report = run(dsn, idle=5.0, retry_base_seconds=0.2)
    assert (report.claimed, report.retried, report.failed, report.ok) == (3, 2, 1, False)
    trail = events(conn, j)
    assert [e[1] for e in trail] == ["pending", "running", "pending", "running", "pending",
                                     "running", "failed"]
    assert all("no disk" in (e[2] or "") for e in trail if e[1] in ("pending", "failed")
               and e[0] == "running")
    r = row(conn, j)
    assert r["attempt_count"] == 3 and r["status"] == "failed"
    claims = [e["at"] for e in conn.execute(
        "SELECT at FROM job_events WHERE job_id = %s AND to_status = 'running' "
        "ORDER BY event_id", (j,))]
    # Backoff: base 0.2 s, doubling, jittered (at least half of it) between the claims.
    assert (claims[1] - claims[0]).total_seconds() >= 0.1
    assert (claims[2] - claims[1]).total_seconds() >= 0.2


def test_a_retry_resumes_at_the_action_that_failed(dsn: str, store: Store, plugin: Any) -> None:
    j = job(store, ("shout", {"text": "once"}), ("fail_first", {"times": 1}))
    report = run(dsn, idle=3.0)
    assert (report.claimed, report.retried, report.succeeded) == (2, 1, 1)
    assert [c[:2] for c in plugin.CALLS] == [("fail_first", 1), ("fail_first", 1)]
    results = store.jobs.action_results([j])
    assert [(r.action_index, r.status) for r in results].count((0, "succeeded")) == 1
    assert store.jobs.get(j).status == "succeeded"  # type: ignore[union-attr]


def test_a_run_timeout_gives_the_job_back(dsn: str, store: Store, conn: Connection) -> None:
    j = job(store, ("wait", {"seconds": 30}), timeout_seconds=0.5, max_attempts=2)
    started = time.monotonic()
    report = run(dsn, max_jobs=1)
    assert time.monotonic() - started < 10
    assert (report.claimed, report.retried) == (1, 1)
    r = row(conn, j)
    assert r["status"] == "pending" and r["reason"] == "timed out"


def cancel_myself(dsn: str) -> Any:
    def hook(ctx: Any) -> dict[str, Any]:
        other = db.connect(dsn.direct if hasattr(dsn, "direct") else dsn)
        try:
            Store(other).jobs.cancel(job_id=ctx.job_id, reason="operator")
        finally:
            other.close()
        return {"stopped": ctx.stop.wait(10)}
    return hook


def test_a_fence_lost_in_the_middle_of_an_action_writes_nothing(
        dsn: str, store: Store, conn: Connection, plugin: Any) -> None:
    plugin.HOOKS["cancel"] = cancel_myself(dsn)
    j = job(store, ("hook", {"hook": "cancel"}), ("shout", {"text": "never"}))
    started = time.monotonic()
    report = run(dsn)
    assert time.monotonic() - started < 5  # told at once, not at the next heartbeat
    assert (report.claimed, report.lost, report.ok) == (1, 1, False)
    assert [c[0] for c in plugin.CALLS] == ["hook"]
    r = row(conn, j)
    assert r["status"] == "cancelled" and r["stopping_attempt_id"] is None  # confirmed
    assert store.jobs.action_results([j]) == []
    assert [e[1] for e in events(conn, j)].count("cancelled") == 1


def test_one_fence_lost_while_the_others_finish(dsn: str, store: Store, conn: Connection,
                                                plugin: Any) -> None:
    plugin.HOOKS["cancel"] = cancel_myself(dsn)
    lost = job(store, ("hook", {"hook": "cancel"}), priority=10)
    others = [job(store, ("wait", {"seconds": 1.0}), ("shout", {"text": str(i)}))
              for i in range(3)]
    report = run(dsn, concurrency=4)
    assert (report.claimed, report.lost, report.succeeded) == (4, 1, 3)
    assert row(conn, lost)["status"] == "cancelled"
    for j in others:
        assert row(conn, j)["status"] == "succeeded"
        assert [e[1] for e in events(conn, j)].count("succeeded") == 1


def test_a_claim_refused_at_the_terminal_write_leaves_the_write_and_claims_again(
        dsn: str, store: Store, conn: Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    first = job(store, ("shout", {"text": "a"}), priority=1)
    second = job(store, ("shout", {"text": "b"}))
    finish_many = Attempts.finish_many
    refused = []

    def refusing(self: Attempts, writes: Any, *, claim: ClaimRequest | None = None) -> Any:
        if claim is not None:  # the database refuses the claim: nothing of it commits
            refused.append(claim)
            claim = claim._replace(lease_seconds=0)
        return finish_many(self, writes, claim=claim)

    monkeypatch.setattr(Attempts, "finish_many", refusing)
    report = run(dsn)
    assert refused and (report.claimed, report.succeeded, report.ok) == (2, 2, True)
    a, b = row(conn, first), row(conn, second)
    assert a["status"] == b["status"] == "succeeded"
    assert b["claimed_at"] > a["finished_at"]  # claimed by the loop, after the write


def test_nothing_ready(dsn: str, store: Store) -> None:
    job(store, ("shout", {"text": "later"}), delay_seconds=3600)
    report = run(dsn, concurrency=3)
    assert (report.claimed, report.ok, report.stopped_by) == (0, True, "nothing_ready")


def test_many_jobs_at_once_each_with_its_own_claim(dsn: str, store: Store,
                                                   conn: Connection) -> None:
    jobs = [job(store, ("wait", {"seconds": 0.4})) for _ in range(8)]
    report = run(dsn, concurrency=4)
    assert (report.claimed, report.succeeded, report.ok) == (8, 8, True)
    rows = [row(conn, j) for j in jobs]
    assert len({r["attempt_id"] for r in rows}) == 8
    spans = [(r["claimed_at"], r["finished_at"]) for r in rows]
    most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert most == 4  # four at once, never more: claims only for free slots


def test_max_jobs_counts_every_claim_riding_or_not(dsn: str, store: Store,
                                                   conn: Connection) -> None:
    for i in range(10):
        job(store, ("shout", {"text": str(i)}))
    report = run(dsn, max_jobs=5, concurrency=2)
    assert (report.claimed, report.succeeded, report.stopped_by) == (5, 5, "max_jobs")
    left = conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'pending'").fetchone()
    assert left is not None and left["n"] == 5


def test_a_worker_that_stops_claiming_lets_its_jobs_finish(dsn: str, store: Store) -> None:
    for _ in range(3):
        job(store, ("wait", {"seconds": 0.5}))
    report = Worker(settings(dsn), concurrency=3).run(100, max_seconds=0.2)
    assert (report.claimed, report.succeeded, report.ok) == (3, 3, True)


def test_one_run_timeout_while_the_others_finish(dsn: str, store: Store,
                                                 conn: Connection) -> None:
    slow = job(store, ("wait", {"seconds": 30}), timeout_seconds=0.5, max_attempts=2,
               priority=10)
    quick = [job(store, ("wait", {"seconds": 0.8})) for _ in range(2)]
    report = Worker(settings(dsn), concurrency=3).run(3)
    assert (report.claimed, report.retried, report.succeeded) == (3, 1, 2)
    assert row(conn, slow)["reason"] == "timed out"
    assert all(row(conn, j)["status"] == "succeeded" for j in quick)


def test_failing_jobs_at_once_each_retried_on_its_own(dsn: str, store: Store,
                                                      conn: Connection) -> None:
    failing = [job(store, ("fail", {"message": f"no {i}"}), max_attempts=2) for i in range(3)]
    fine = [job(store, ("shout", {"text": str(i)})) for i in range(3)]
    report = run(dsn, concurrency=6, idle=3.0)
    assert (report.succeeded, report.retried, report.failed) == (3, 3, 3)
    for i, j in enumerate(failing):
        r = row(conn, j)
        assert r["status"] == "failed" and r["attempt_count"] == 2 and r["error"] == f"no {i}"
    assert all(row(conn, j)["status"] == "succeeded" for j in fine)
