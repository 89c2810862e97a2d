"""The audit trail and the job metrics are written per statement (statement-level triggers
over transition tables): under many workers at once, each finishing its jobs in batches and
claiming the next ones in the same statement's transaction, every job still has exactly
one event per transition — enqueued, claimed with its own fence, finished — and the metrics
folded from the triggers' rows count every job once."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any
from uuid import UUID

from jobfence import db
from jobfence.store import ClaimRequest, Store, TerminalWrite
from tests.support.factories import new_job

JOBS = 400
WORKERS = 6
BATCH = 10


def work(dsn: Any, start: threading.Barrier, errors: list[BaseException]) -> None:
    """One worker: claims a batch, then writes its terminal writes and claims the next
    batch in one transaction, until nothing is left; every seventh job fails."""
    conn = db.connect(dsn, pooler=getattr(dsn, "pooler", "none"))
    try:
        store = Store(conn)
        start.wait()
        ask = ClaimRequest(worker_id=f"w{threading.get_ident()}", lease_seconds=300,
                           queue="default", limit=BATCH)
        held = store.attempts.claim(worker_id=ask.worker_id, lease_seconds=300, limit=BATCH)
        while held:
            writes = [TerminalWrite(c.job_id, c.attempt_id, succeeded=c.job_id.int % 7 != 0)
                      for c in held]
            written, held = store.attempts.finish_many(writes, claim=ask)
            assert written == {w.job_id for w in writes}
    except BaseException as exc:  # reported by the test, not lost in the thread
        errors.append(exc)
    finally:
        conn.close()


def test_concurrent_batches_write_one_event_per_transition(store: Store, conn: Any,
                                                           dsn: Any) -> None:
    ids = [e.job_id for e in store.jobs.enqueue([new_job() for _ in range(JOBS)])]
    start, errors = threading.Barrier(WORKERS), []
    threads = [threading.Thread(target=work, args=(dsn, start, errors))
               for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors

    jobs = {r["job_id"]: r for r in conn.execute(
        "SELECT job_id, status, attempt_id, attempt_count FROM jobfence.jobs")}
    assert set(jobs) == set(ids)
    events: dict[UUID, list[tuple[Any, ...]]] = {}
    for r in conn.execute("""SELECT job_id, from_status, to_status, attempt_id, attempt
                             FROM jobfence.job_events ORDER BY event_id"""):
        events.setdefault(r["job_id"], []).append(
            (r["from_status"], r["to_status"], r["attempt_id"], r["attempt"]))
    failed = {j for j in ids if j.int % 7 == 0}
    for job_id, job in jobs.items():
        end = "failed" if job_id in failed else "succeeded"
        assert job["status"] == end and job["attempt_count"] == 1
        assert events[job_id] == [
            (None, "pending", None, None),
            ("pending", "running", job["attempt_id"], 1),
            ("running", end, job["attempt_id"], None)], job_id

    assert store.job_metrics.fold() > 0
    totals: dict[str, Counter[str]] = {}
    for t in store.job_metrics.totals():
        assert t.queue == "default"
        totals.setdefault(t.name, Counter())[t.label] += int(t.value)
    done = Counter({"succeeded": JOBS - len(failed), "failed": len(failed)})
    assert totals["finished"] == done
    assert totals["attempts"] == done
    assert sum(totals["wait"].values()) == JOBS
    assert sum(totals["run"].values()) == JOBS
