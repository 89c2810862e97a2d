"""Races run as races (ADR-015): many threads, each on its own connection, released at once
by a barrier; the database alone decides."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from devtools.sqlconn import connect
from jobfence.store import Store

THREADS = 50


def race(dsn: str, fn: Callable[[Store], Any]) -> list[Any]:
    """Run fn on THREADS connections at the same instant; results or raised exceptions."""
    conns = [connect(dsn) for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)

    def one(i: int) -> Any:
        store = Store(conns[i])
        barrier.wait()
        try:
            return fn(store)
        except Exception as exc:
            return exc

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            return list(pool.map(one, range(THREADS)))
    finally:
        for c in conns:
            c.close()


def drain_racing(dsn: str, queue: str, *, threads: int, batches: tuple[int, ...],
                 most: int) -> int:
    """``threads`` claimers of ``queue``, each on its own connection, released at once and
    claiming in a loop — batches of a size drawn from ``batches``, each job held a random
    moment, then finished — until nothing of the queue is pending or running; no claim
    larger than ``most``. How many jobs they finished."""
    import random
    import time

    barrier = threading.Barrier(threads)
    done = threading.Event()

    def claimer(i: int) -> int:
        rnd = random.Random(i)
        finished = 0
        with connect(dsn) as conn:
            s = Store(conn)
            barrier.wait()
            while not done.is_set():
                claims = s.attempts.claim(worker_id=f"racer-{i}", lease_seconds=60,
                                          queue=queue, limit=rnd.choice(batches))
                assert len(claims) <= most
                if not claims:
                    if not s.jobs.page(status="pending", queue=queue, limit=1) and \
                            not s.jobs.page(status="running", queue=queue, limit=1):
                        done.set()
                    time.sleep(rnd.uniform(0, 0.003))
                    continue
                time.sleep(rnd.uniform(0, 0.01))
                for c in claims:
                    assert s.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id,
                                             succeeded=True) is not None
                    finished += 1
        return finished

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(claimer, range(threads)))
