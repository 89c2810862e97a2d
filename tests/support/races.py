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
