"""The guards, on a fake clock and a fake database: every lease renewed on time in one
statement, a missed heartbeat retried sooner, an execution that cannot renew fences itself
before its lease ends, a fence lost to a cancel stops that execution only, a run timeout
stops its own — each stop killing what the action started. No thread, no sleep: the test
drives the guards' steps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from jobfence.errors import StoreUnavailable
from jobfence.settings import Settings
from jobfence.store import Claim
from jobfence.store.types import Fence
from jobfence.worker import guard as guard_module
from jobfence.worker.guard import Guard, StopReason
from jobfence.worker.guard_threads import Guards

LEASE, HEARTBEAT = 10.0, 2.5


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeDatabase:
    """What the guards' side channel reaches: heartbeats answer as told."""

    listening = False

    def __init__(self) -> None:
        self.answers: list[Any] = []  # a set of job ids renewed ("all": every one), or an error
        self.beats = 0
        self.rows: list[int] = []

    def call(self, fn: Callable[[Any], Any], **_: object) -> Any:
        return fn(self)

    def close_quietly(self) -> None:
        pass

    @property
    def attempts(self) -> FakeDatabase:
        return self

    def heartbeat_many(self, held: Sequence[tuple[UUID, UUID]],
                       lease_seconds: float) -> dict[UUID, datetime]:
        self.beats += 1
        self.rows.append(len(held))
        answer = self.answers.pop(0) if self.answers else "all"
        if isinstance(answer, Exception):
            raise answer
        return {j: datetime.now(UTC) for j, _ in held if answer == "all" or j in answer}

    def fence(self, job_id: object, attempt_id: object) -> Fence:
        return Fence(status="cancelled", holds=False, reason="cancelled by operator")


@pytest.fixture
def killed(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    kills: list[object] = []
    monkeypatch.setattr(guard_module, "kill_group", kills.append)
    monkeypatch.setattr(guard_module, "kill_descendants", lambda **_: kills.append("tree"))
    return kills


def settings() -> Settings:
    return Settings(database_url="postgresql://db/jobfence", lease_seconds=LEASE,
                    heartbeat_seconds=HEARTBEAT)


def claim(timeout: float | None = None) -> Claim:
    claimed = datetime.now(UTC)
    return Claim(job_id=uuid4(), attempt_id=uuid4(), attempt_count=1, max_attempts=3,
                 actions=[], inputs=None, parent_id=None,
                 lease_expires_at=claimed + timedelta(seconds=LEASE),
                 run_deadline_at=claimed + timedelta(seconds=timeout) if timeout else None)


def guards(clock: Clock, db: FakeDatabase) -> Guards:
    g = Guards(settings(), db, clock)  # type: ignore[arg-type]
    g._threads = [object()]  # type: ignore[list-item]  # the test drives the steps
    return g


def held(gs: Guards, n: int = 1, timeout: float | None = None) -> list[Guard]:
    out = []
    for i in range(n):
        g = gs.guard(claim(timeout))
        g.track(4242 + i)
        out.append(g)
    return out


def test_every_lease_is_renewed_on_time_in_one_statement(killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    gs = guards(clock, db)
    jobs = held(gs, 3)
    for _ in range(10):  # 25 s: two and a half leases, renewed all along
        clock.now = gs._next_beat
        gs.beat()
        assert all(g.lease_live() for g in jobs)
    assert db.beats == 10 and db.rows == [3] * 10
    assert not any(g.stop.is_set() for g in jobs) and killed == []
    assert gs._next_beat == clock.now + HEARTBEAT


def test_a_missed_heartbeat_is_retried_sooner_and_the_leases_kept(
        killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    gs = guards(clock, db)
    [g] = held(gs)
    db.answers = [StoreUnavailable("connection refused")]
    clock.now = gs._next_beat
    gs.beat()  # failed, not fatal
    assert gs._next_beat == clock.now + 1.0  # sooner than the period
    clock.now = gs._next_beat
    gs.beat()
    assert g.lease_live() and not g.stop.is_set()


def test_executions_that_cannot_renew_fence_themselves_before_their_lease_ends(
        killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    gs = guards(clock, db)
    jobs = held(gs, 2)
    db.answers = [StoreUnavailable("down")] * 100
    started = clock.now
    while not all(g.deadline_passed() for g in jobs):
        clock.now += 0.25
        if clock.now >= gs._next_beat:
            gs.beat()
    assert all(g.reason is StopReason.LEASE_EXPIRED for g in jobs)
    assert clock.now - started < LEASE  # before the database's deadline
    beats = db.beats
    gs.beat()
    assert db.beats == beats  # and nothing more is written for them
    assert sorted(k for k in killed if k != "tree") == [4242, 4243]


def test_a_fence_lost_to_a_cancel_stops_that_execution_only(killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    gs = guards(clock, db)
    jobs = held(gs, 3)
    db.answers = [{jobs[0].job_id, jobs[2].job_id}]  # the second's fence was rotated
    clock.now = gs._next_beat
    gs.beat()
    assert jobs[1].reason is StopReason.FENCE_LOST and jobs[1].stop.is_set()
    assert not jobs[0].stop.is_set() and not jobs[2].stop.is_set()
    assert killed == [4243, "tree"]
    assert not jobs[1].request_stop(StopReason.SIGTERM)  # the first reason wins
    clock.now = gs._next_beat
    gs.beat()
    assert db.rows[-1] == 2  # the stopped one is no longer renewed


def test_a_run_timeout_stops_its_own_execution(killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    gs = guards(clock, db)
    [short] = held(gs, timeout=5.0)
    [long] = held(gs, timeout=50.0)
    clock.now += 4.9
    assert not short.deadline_passed()
    clock.now += 0.2
    assert short.deadline_passed() and short.reason is StopReason.TIMED_OUT
    assert not long.deadline_passed() and long.reason is None


def test_after_sigterm_a_new_claim_is_given_back_at_once(killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    back: list[list[tuple[UUID, UUID]]] = []
    db.interrupt_many = lambda h, **_: back.append(list(h)) or []  # type: ignore[attr-defined]
    gs = guards(clock, db)
    jobs = held(gs, 2)
    gs.give_back_all()
    assert back == [[g.held for g in jobs]]
    assert all(g.reason is StopReason.SIGTERM for g in jobs)
    late = gs.guard(claim())
    assert late.reason is StopReason.SIGTERM and back[-1] == [late.held]
