"""Guards that outlive their faults (invariant 15), on a real database and real processes:
the guards' connection killed by the server (``pg_terminate_backend``: a restart, a
failover, a pooler restart) while the heartbeat waits on it, fifty times in a row; every
step of every guard failing in turn — a connection lost, a byte that does not decode, an
``OSError``, a plain bug — while jobs are renewed, a cancel reaches its command and SIGTERM
gives the others back; and guards that cannot run at all (a thread that will not start, a
watchdog whose every tick fails), which give every job back at once and say so."""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest

from jobfence.db import Connection
from jobfence.settings import Settings
from jobfence.store import Claim, Store
from jobfence.worker import guard as guard_module
from jobfence.worker.faults import Faults
from jobfence.worker.guard import Guard, StopReason
from jobfence.worker.guard_threads import Guards
from jobfence.worker.side_channel import SideChannel
from tests.support.factories import enqueue_one
from tests.support.procs import wait_for

LEASE = 3.0


def settings(dsn: str, **kw: Any) -> Settings:
    kw.setdefault("lease_seconds", LEASE)
    kw.setdefault("stop_check_seconds", 0.1)
    return Settings(database_url=dsn, **kw)


def guards_backend(conn: Connection, not_pid: int | None = None) -> int | None:
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'jobfence-heartbeat' "
        "AND datname = current_database() AND pid IS DISTINCT FROM %s "
        "ORDER BY backend_start DESC LIMIT 1", (not_pid,)).fetchone()
    return None if row is None else int(row["pid"])


def kill_backend(conn: Connection, pid: int) -> None:
    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def lease_left(conn: Connection, job: UUID) -> float:
    row = conn.execute("SELECT extract(epoch FROM visible_at - clock_timestamp()) AS s "
                       "FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row is not None and row["s"] is not None
    return float(row["s"])


def status(conn: Connection, job: UUID) -> str:
    row = conn.execute("SELECT status FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row is not None
    return str(row["status"])


def claim_all(store: Store, n: int) -> list[Claim]:
    for _ in range(n):
        enqueue_one(store)
    claims = store.attempts.claim(worker_id="w", lease_seconds=LEASE, limit=n)
    assert len(claims) == n
    return claims


@pytest.fixture
def children() -> Iterator[Callable[[Guard], subprocess.Popen[bytes]]]:
    """A real command per guard, in a process group of its own, registered with it."""
    started: list[subprocess.Popen[bytes]] = []

    def start(g: Guard) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["sleep", "120"], start_new_session=True)
        started.append(p)
        g.track(p.pid)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


# -- a killed connection ---------------------------------------------------------------------


def test_a_lost_guards_connection_tells_no_stop_and_raises_nothing(
        dsn: str, conn: Connection) -> None:
    """The heartbeat waits on its LISTEN connection when the server ends it: reading the
    notifications finds it lost and closes it, and the wait must not then ask the closed
    connection for its socket (psycopg raises from ``fileno`` there)."""
    side = SideChannel(settings(dsn))
    try:
        side.call(lambda s: s.schedules.clock())
        assert side.listening
        pid = guards_backend(conn)
        assert pid is not None
        kill_backend(conn, pid)
        time.sleep(0.2)  # the server's goodbye is on the socket
        assert side.told(0.1) == set()
        assert side.told(0.1) == set()
        side.call(lambda s: s.schedules.clock())  # and it connects again
        assert side.listening and guards_backend(conn) not in (None, pid)
    finally:
        side.close_quietly()


def test_the_guards_outlive_fifty_killed_connections_in_a_row(
        dsn: str, store: Store, conn: Connection, children: Any) -> None:
    """Fifty times the server ends the guards' connection, each time once the one before it
    was replaced and renewed the leases: the heartbeat thread lives on, every lease is
    renewed after every kill (no job self-fences), and a cancel afterwards still reaches
    its command within a second or two."""
    claims = claim_all(store, 2)
    guards = Guards(settings(dsn, heartbeat_seconds=0.2), faults=Faults())
    gs = [guards.guard(c) for c in claims]
    procs = [children(g) for g in gs]
    try:
        last = None
        for _ in range(50):
            pid = wait_for(lambda: guards_backend(conn, last), timeout=10)
            renewed = expiries(conn, claims)
            kill_backend(conn, pid)
            last = pid
            # renewed again, through a new connection
            wait_for(lambda: all(a > b for a, b in zip(expiries(conn, claims), renewed,
                                                          strict=True)), timeout=LEASE)
        assert all(t.is_alive() for t in guards._threads)
        assert not any(g.stop.is_set() for g in gs), [g.reason for g in gs]
        store.jobs.cancel(job_id=claims[0].job_id, reason="not needed")
        wait_for(gs[0].stop.is_set, timeout=3)
        assert gs[0].reason is StopReason.FENCE_LOST
        assert procs[0].wait(timeout=3) == -9
        assert procs[1].poll() is None and not gs[1].stop.is_set()
    finally:
        guards.close()


def expiries(conn: Connection, claims: list[Claim]) -> list[Any]:
    return [conn.execute("SELECT visible_at FROM jobs WHERE job_id = %s",
                         (c.job_id,)).fetchone()["visible_at"]  # type: ignore[index]
            for c in claims]


# -- every step failing in turn --------------------------------------------------------------


def faults_in_turn() -> Iterator[BaseException]:
    """What a guard's step can meet, one after the other."""
    def undecodable() -> BaseException:
        try:
            b"\xff\xfe".decode()
        except UnicodeDecodeError as exc:
            return exc
        raise AssertionError

    makers: list[Callable[[], BaseException]] = [
        lambda: psycopg.OperationalError("server closed the connection unexpectedly"),
        undecodable,
        lambda: OSError(5, "Input/output error"),
        lambda: AttributeError("'NoneType' object has no attribute 'pid'"),  # a plain bug
    ]
    for make in itertools.cycle(makers):
        yield make()


class Injector:
    """Wraps a guard step so that every ``every``-th call raises the next fault instead."""

    def __init__(self) -> None:
        self.faults = faults_in_turn()
        self.raised: dict[str, int] = {}
        self._lock = threading.Lock()
        self.on = True

    def wrap(self, name: str, fn: Callable[..., Any], every: int) -> Callable[..., Any]:
        calls = itertools.count(1)

        def wrapped(*args: Any, **kw: Any) -> Any:
            if self.on and next(calls) % every == 0:
                with self._lock:
                    self.raised[name] = self.raised.get(name, 0) + 1
                    fault = next(self.faults)
                raise fault
            return fn(*args, **kw)

        return wrapped


def test_every_guard_step_failing_in_turn_still_renews_stops_and_gives_back(
        dsn: str, store: Store, conn: Connection, children: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    inject = Injector()
    monkeypatch.setattr(SideChannel, "told", inject.wrap("told", SideChannel.told, 2))
    monkeypatch.setattr(SideChannel, "call", inject.wrap("call", SideChannel.call, 3))
    monkeypatch.setattr(Guard, "deadline_passed",
                        inject.wrap("deadline", Guard.deadline_passed, 4))
    monkeypatch.setattr(Guard, "renewed", inject.wrap("renewed", Guard.renewed, 5))
    monkeypatch.setattr(guard_module, "kill_group",
                        inject.wrap("kill", guard_module.kill_group, 2))
    claims = claim_all(store, 3)
    faults = Faults()
    guards = Guards(settings(dsn), faults=faults)
    gs = [guards.guard(c) for c in claims]
    procs = [children(g) for g in gs]
    try:
        time.sleep(2 * LEASE)  # two leases: only renewals keep them
        assert not any(g.stop.is_set() for g in gs), [g.reason for g in gs]
        assert all(lease_left(conn, c.job_id) > 0.5 for c in claims)
        assert all(t.is_alive() for t in guards._threads)
        # a cancel reaches its command (the kill that failed is tried again)
        store.jobs.cancel(job_id=claims[0].job_id, reason="not needed")
        wait_for(gs[0].stop.is_set, timeout=3)
        assert gs[0].reason is StopReason.FENCE_LOST
        assert procs[0].wait(timeout=3) == -9
        # SIGTERM gives the others back, their commands killed
        guards.give_back_all()
        assert [status(conn, c.job_id) for c in claims[1:]] == ["pending", "pending"]
        assert all(p.wait(timeout=3) == -9 for p in procs[1:])
        assert all(g.reason is StopReason.SIGTERM for g in gs[1:])
    finally:
        inject.on = False
        guards.close()
    assert set(inject.raised) == {"told", "call", "deadline", "renewed", "kill"}, inject.raised
    for guard in ("stop_check", "watchdog", "heartbeat", "tree_kill"):
        assert faults.total[guard] > 0, faults.total
    # counted in the metrics: written by the guards, folded by a pass
    store.job_metrics.fold()
    counted = {t.label: t.value for t in store.job_metrics.totals() if t.name == "guard_faults"}
    assert counted == {g: float(n) for g, n in faults.total.items()}


# -- guards that cannot run --------------------------------------------------------------------


def test_a_watchdog_whose_every_tick_fails_gives_every_job_back_at_once(
        dsn: str, store: Store, conn: Connection, children: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(self: Guard) -> bool:
        raise AttributeError("a bug in every tick")

    claims = claim_all(store, 2)
    guards = Guards(settings(dsn), faults=Faults())
    gs = [guards.guard(c) for c in claims]
    procs = [children(g) for g in gs]
    monkeypatch.setattr(Guard, "deadline_passed", bug)
    try:
        began = time.monotonic()
        wait_for(guards.failed.is_set, timeout=LEASE)
        assert time.monotonic() - began < LEASE - 1  # before the leases would end
        wait_for(lambda: [status(conn, c.job_id) for c in claims] == ["pending"] * 2,
                 timeout=2)
        assert all(g.reason is StopReason.GUARDS_FAILED for g in gs)
        assert all(p.wait(timeout=3) == -9 for p in procs)
        # a claim made afterwards is given back as it arrives
        [late] = claim_all(store, 1)
        g = guards.guard(late)
        assert g.reason is StopReason.GUARDS_FAILED
        assert status(conn, late.job_id) == "pending"
        row = conn.execute("SELECT attempt_count FROM jobs WHERE job_id = %s",
                           (late.job_id,)).fetchone()
        assert row is not None and row["attempt_count"] == 0  # its attempt not spent
    finally:
        guards.close()


def test_a_guard_thread_that_will_not_start_gives_the_job_back_at_once(
        dsn: str, store: Store, conn: Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_thread(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(Guards, "_start", staticmethod(no_thread))
    [claim] = claim_all(store, 1)
    guards = Guards(settings(dsn), faults=Faults())
    try:
        g = guards.guard(claim)
        assert g.reason is StopReason.GUARDS_FAILED and guards.failed.is_set()
        assert status(conn, claim.job_id) == "pending"
    finally:
        guards.close()


def test_a_worker_whose_guards_fail_gives_its_job_back_and_exits_1(
        dsn: str, store: Store, conn: Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole worker: its watchdog cannot judge the running job, so the job is given back
    (pending, its attempt not spent), nothing more is claimed, and the report says why."""
    from jobfence.worker.loop import Worker

    def bug(self: Guard) -> bool:
        raise AttributeError("a bug in every tick")

    first = enqueue_one(store, actions=[{"name": "sleep", "params": {"seconds": 60}}])
    second = enqueue_one(store, actions=[{"name": "sleep", "params": {"seconds": 0}}])
    monkeypatch.setattr(Guard, "deadline_passed", bug)
    began = time.monotonic()
    report = Worker(settings(dsn)).run(10)
    assert time.monotonic() - began < LEASE
    assert (report.stopped_by, report.ok, report.claimed) == ("guards_failed", False, 1)
    assert status(conn, first) == "pending" and status(conn, second) == "pending"
    row = conn.execute("SELECT attempt_count FROM jobs WHERE job_id = %s", (first,)).fetchone()
    assert row is not None and row["attempt_count"] == 0
