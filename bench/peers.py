"""The peers, doing the same no-op work as jobfence on the same server: procrastinate and
pgqueuer, through their own Python APIs (installed in the bench virtualenv only).

    python -m bench.peers SYSTEM setup DSN JOBS     # install the schema, enqueue JOBS
                                                    # (pgqueuer: prints how long that took)
    python -m bench.peers SYSTEM work DSN [BATCH]   # drain the queue; print one JSON line

SYSTEM is ``procrastinate`` or ``pgqueuer``. A worker prints the wall-clock times of the
first job's start and the last job's end it ran, and how many it ran, so the caller measures
every system the same way: jobs / (last end - first start) over all worker processes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import timedelta

stamps: list[float] = []


def mark() -> None:
    stamps.append(time.time())


def report() -> None:
    print(json.dumps({"first": min(stamps) if stamps else None,
                      "last": max(stamps) if stamps else None, "n": len(stamps) // 2}))


# -- procrastinate ---------------------------------------------------------------------


def procrastinate_app(dsn: str):  # type: ignore[no-untyped-def]
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    def noop() -> None:
        mark()
        mark()

    return app, noop


def procrastinate_setup(dsn: str, jobs: int) -> None:
    app, noop = procrastinate_app(dsn)
    with app.open():
        app.schema_manager.apply_schema()
        for start in range(0, jobs, 1000):
            noop.batch_defer(*[{}] * min(1000, jobs - start))


def procrastinate_work(dsn: str, _batch: int) -> None:
    app, _ = procrastinate_app(dsn)
    with app.open():
        app.run_worker(wait=False, concurrency=1, install_signal_handlers=False)


# -- pgqueuer --------------------------------------------------------------------------


async def _pgqueuer(dsn: str, jobs: int | None, batch: int) -> None:
    import psycopg
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    queries = Queries(PsycopgDriver(conn))
    if jobs is not None:
        await queries.install()
        started = time.perf_counter()
        for start in range(0, jobs, 1000):
            n = min(1000, jobs - start)
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        print(json.dumps({"enqueue_seconds": time.perf_counter() - started}))
    else:
        qm = QueueManager(queries)

        @qm.entrypoint("noop")
        async def noop(job: object) -> None:
            mark()
            mark()

        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain,
                     dequeue_timeout=timedelta(seconds=1))
    await conn.close()


def main() -> int:
    system, role, dsn = sys.argv[1:4]
    arg = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    if system == "procrastinate":
        (procrastinate_setup if role == "setup" else procrastinate_work)(dsn, arg)
    elif system == "pgqueuer":
        asyncio.run(_pgqueuer(dsn, arg if role == "setup" else None, arg))
    else:
        raise SystemExit(f"unknown system {system!r}")
    if role == "work":
        report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
