"""A command's streams on S3, as the store keeps them: registered only by the attempt that
holds the fence (``worker_register_log``), read back in order (``jobfence.joblogs``), and
deleted by retention with the job — a job whose only objects are its logs included."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from devtools.memory_objects import MemoryObjectStore
from jobfence.ids import uuid7
from jobfence.joblogs import Logs
from jobfence.objectstore import log_key
from jobfence.store import ActionOutcome, Store
from tests.support.factories import enqueue_one, installation
from tests.support.lifecycle import BUCKET, HOUR, db_now, run

pytestmark = pytest.mark.pooled  # directly and through PgBouncer


def test_a_log_is_registered_only_by_the_attempt_holding_the_fence(store: Store) -> None:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    stale = uuid7()
    assert not store.attempts.register_log(job_id=job_id, attempt_id=stale, action_index=0)
    assert not store.attempts.register_log(job_id=job_id, attempt_id=claim.attempt_id,
                                           action_index=1)  # the job has one action
    for _ in range(2):  # a repeated registration is harmless
        assert store.attempts.register_log(job_id=job_id, attempt_id=claim.attempt_id,
                                           action_index=0)
    assert store.jobs.logged_actions(job_id, claim.attempt_id) == [0]
    assert store.jobs.logged_actions(job_id, stale) == []
    assert store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True)
    assert not store.attempts.register_log(job_id=job_id, attempt_id=claim.attempt_id,
                                           action_index=0)  # ended: nothing more


def test_logs_read_back_in_order_and_retention_deletes_them_with_the_job(
        store: Store, dsn: str) -> None:
    objects = MemoryObjectStore()
    job_id = enqueue_one(store, ttl_seconds=60)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    assert store.attempts.register_log(job_id=job_id, attempt_id=claim.attempt_id,
                                       action_index=0)
    where = installation(store)
    for n, data in ((2, b"second\n"), (1, b"first\n"), (10, b"tenth\n")):
        objects.put_bytes(BUCKET, log_key(where, job_id, claim.attempt_id, 0, "stdout",
                                          sequence=n), data)
    objects.put_bytes(BUCKET, log_key(where, job_id, claim.attempt_id, 0, "stdout",
                                      sequence=1) + ".tmp", b"not one of ours")
    outcome = ActionOutcome(0, "sleep", True, datetime.now(UTC),
                            result={"stdout_tail": "tenth\n", "stdout_bytes": 20,
                                    "stderr_tail": "", "stderr_bytes": 0,
                                    "output_on_s3": True})
    assert store.attempts.finish(job_id=job_id, attempt_id=claim.attempt_id, succeeded=True,
                                 outcome=outcome)
    logs = Logs(store, lambda: objects, BUCKET, where)
    attempt = logs.attempt(job_id)
    assert (attempt.number, attempt.attempt_id, attempt.running) == (1, claim.attempt_id,
                                                                      False)
    [out, err] = logs.pieces(job_id, attempt)
    assert (out.stream, out.on_s3, out.size, out.whole) == ("stdout", True, 20, True)
    assert [data for _, data in logs.read(job_id, attempt, out)] == [
        b"first\n", b"second\n", b"tenth\n"]
    assert [n for n, _ in logs.read(job_id, attempt, out, after=2)] == [10]
    assert list(logs.read(job_id, attempt, err)) == []  # it wrote nothing there

    report = run(store, dsn, now=db_now(store) + HOUR, objects=objects)
    assert report.retention_jobs_deleted == 1
    assert not list(objects.iter_objects(BUCKET, ""))
