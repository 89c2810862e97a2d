"""AttemptGuard, on a fake clock and a fake database: the lease is renewed on time, a missed
heartbeat is retried sooner, the attempt fences itself before its lease ends when it cannot
renew, and a fence lost to a cancel stops it at once — each stop killing what the action
started. No thread, no sleep: the test drives the guard's steps."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest

from jobfence import attempt
from jobfence.attempt import AttemptGuard, StopReason
from jobfence.errors import StoreUnavailable
from jobfence.settings import Settings
from jobfence.store import Claim
from jobfence.store.types import Fence

LEASE, HEARTBEAT = 10.0, 2.5


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeDatabase:
    """What the guard's side channel reaches: heartbeats answer as told."""

    def __init__(self) -> None:
        self.answers: list[Any] = []  # a datetime (renewed), None (fence lost), or an error
        self.beats = 0

    def call(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self)

    @property
    def attempts(self) -> FakeDatabase:
        return self

    def heartbeat(self, **_: object) -> datetime | None:
        self.beats += 1
        answer = self.answers.pop(0) if self.answers else datetime.now(UTC)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    def fence(self, job_id: object, attempt_id: object) -> Fence:
        return Fence(status="cancelled", holds=False, reason="cancelled by operator")


@pytest.fixture
def killed(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    kills: list[object] = []
    monkeypatch.setattr(attempt, "kill_group", kills.append)
    monkeypatch.setattr(attempt, "kill_descendants", lambda **_: kills.append("tree"))
    return kills


def guard(clock: Clock, db: FakeDatabase, timeout: float | None = None) -> AttemptGuard:
    settings = Settings(database_url="postgresql://db/jobfence", lease_seconds=LEASE,
                        heartbeat_seconds=HEARTBEAT)
    claimed = datetime.now(UTC)
    claim = Claim(job_id=uuid4(), attempt_id=uuid4(), attempt_count=1, max_attempts=3,
                  actions=[], inputs=None, parent_id=None,
                  lease_expires_at=claimed + timedelta(seconds=LEASE),
                  run_deadline_at=claimed + timedelta(seconds=timeout) if timeout else None)
    g = AttemptGuard(claim, settings, db, threads=None, clock=clock)  # type: ignore[arg-type]
    g.track(4242)
    return g


def test_the_lease_is_renewed_on_time_and_the_deadline_moves(killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    g = guard(clock, db)
    assert g.next_beat == 100.0 + HEARTBEAT
    for _ in range(10):  # 25 s: two and a half leases, renewed all along
        clock.now = g.next_beat
        assert g.beat()
        assert g.lease_live()
    assert db.beats == 10 and not g.stop.is_set() and killed == []
    assert g.next_beat == clock.now + HEARTBEAT


def test_a_missed_heartbeat_is_retried_sooner_and_the_lease_kept(killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    g = guard(clock, db)
    db.answers = [StoreUnavailable("connection refused"), datetime.now(UTC)]
    clock.now = g.next_beat
    assert g.beat()  # failed, not fatal
    assert g.next_beat == clock.now + 1.0  # sooner than the period
    clock.now = g.next_beat
    assert g.beat() and g.lease_live() and not g.stop.is_set()


def test_an_attempt_that_cannot_renew_fences_itself_before_its_lease_ends(
        killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    g = guard(clock, db)
    db.answers = [StoreUnavailable("down")] * 100
    started = clock.now
    while not g.deadline_passed():
        clock.now += 0.25
        if clock.now >= g.next_beat:
            g.beat()
    assert g.reason is StopReason.LEASE_EXPIRED and g.stop.is_set()
    assert clock.now - started < LEASE  # before the database's deadline
    assert not g.lease_live() and not g.beat()  # and it writes nothing more
    assert killed == [4242, "tree"]


def test_a_fence_lost_to_a_cancel_stops_at_the_next_heartbeat(killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    g = guard(clock, db)
    db.answers = [None]  # the heartbeat matched nothing: the fence was rotated
    clock.now = g.next_beat
    assert not g.beat()
    assert g.reason is StopReason.FENCE_LOST and g.stop.is_set()
    assert killed == [4242, "tree"]
    assert not g.request_stop(StopReason.SIGTERM)  # the first reason wins


def test_a_run_timeout_stops_the_attempt(killed: list[object]) -> None:
    clock, db = Clock(), FakeDatabase()
    g = guard(clock, db, timeout=5.0)
    clock.now += 4.9
    assert not g.deadline_passed()
    clock.now += 0.2
    assert g.deadline_passed() and g.reason is StopReason.TIMED_OUT
    assert killed == [4242, "tree"]
