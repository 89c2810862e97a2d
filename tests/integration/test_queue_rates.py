"""A queue's rate on a real PostgreSQL: at most N of its jobs start in any window of its
period, however many claimers race (threads on their own connections, single and batched
claims, directly and through PgBouncer), judged from the claims' own times; the rate leaves
other queues alone, a queue's limit and rate both hold, and setting it is recorded."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import pytest

from devtools.sqlconn import connect
from jobfence.store import Store
from tests.support.factories import new_job

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

RATE, PERIOD = 4, 1.0
THREADS = 8


def most_in_a_window(times: list[datetime], period: float) -> int:
    """The most starts any closed window of ``period`` seconds holds."""
    times = sorted(times)
    span = timedelta(seconds=period)
    return max((sum(1 for u in times[i:] if u - t <= span) for i, t in enumerate(times)),
               default=0)


def test_eight_claimers_never_start_more_than_the_rate_in_any_window(
        dsn: str, store: Store) -> None:
    store.queues.rate("rated", RATE, PERIOD)
    store.jobs.enqueue([new_job(queue="rated") for _ in range(60)])
    store.jobs.enqueue([new_job(queue="free") for _ in range(20)])
    barrier = threading.Barrier(THREADS)
    deadline = time.monotonic() + 3.5 * PERIOD

    def claimer(i: int) -> int:
        rnd = random.Random(i)
        taken = 0
        with connect(dsn) as conn:
            s = Store(conn)
            barrier.wait()
            while time.monotonic() < deadline:
                claims = s.attempts.claim(worker_id=f"racer-{i}", lease_seconds=60,
                                          queue="rated", limit=rnd.choice((1, 1, 3, 10)))
                for c in claims:
                    assert s.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id,
                                             succeeded=True) is not None
                taken += len(claims)
                time.sleep(rnd.uniform(0, 0.01))
        return taken

    with ThreadPoolExecutor(THREADS) as pool:
        taken = sum(pool.map(claimer, range(THREADS)))
    started = [r["claimed_at"] for r in store.conn.execute(
        "SELECT claimed_at FROM jobs WHERE queue = 'rated' AND claimed_at IS NOT NULL")]
    assert len(started) == taken
    assert most_in_a_window(started, PERIOD) == RATE  # contested, and never more
    # Three and a half periods: the fourth window opened too, and no more than that.
    assert 3 * RATE <= taken <= 4 * RATE
    # The other queue is not rate-limited.
    assert len(store.attempts.claim(worker_id="w", lease_seconds=60, queue="free",
                                    limit=20)) == 20


def test_a_rate_and_a_limit_both_hold_and_none_removes_the_rate(store: Store) -> None:
    store.queues.configure("q", limit=2, set_limit=True)
    store.queues.rate("q", 3, 60)
    store.jobs.enqueue([new_job(queue="q") for _ in range(10)])
    first = store.attempts.claim(worker_id="w", lease_seconds=60, queue="q", limit=10)
    assert len(first) == 2  # the limit on running jobs
    for c in first:
        store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True)
    assert len(store.attempts.claim(worker_id="w", lease_seconds=60, queue="q",
                                    limit=10)) == 1  # the rate: 3 per minute
    assert store.attempts.claim(worker_id="w", lease_seconds=60, queue="q", limit=10) == []
    [status] = store.queues.status("q")
    assert (status.rate_limit, status.rate_period_seconds, status.rate_started) == (3, 60.0, 3)
    assert store.queues.scaler_value("q") == 2  # ready work, capped by the limit only
    store.queues.rate("q", None, None)
    [status] = store.queues.status("q")
    assert status.rate_limit is None and status.rate_started is None
    store.queues.configure("q", limit=None, set_limit=True)
    assert len(store.attempts.claim(worker_id="w", lease_seconds=60, queue="q",
                                    limit=10)) == 7
    actions = [r["action"] for r in store.conn.execute(
        "SELECT action FROM control_events WHERE subject = 'q' ORDER BY at")]
    assert actions.count("queue_rate") == 2


def test_a_rate_of_zero_starts_nothing(store: Store) -> None:
    store.queues.rate("stopped", 0, 1)
    store.jobs.enqueue([new_job(queue="stopped")])
    assert store.attempts.claim(worker_id="w", lease_seconds=60, queue="stopped") == []
