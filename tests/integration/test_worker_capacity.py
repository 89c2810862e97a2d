"""A worker that cannot give a claimed job a uid of its own (every uid of
JOBFENCE_COMMAND_UIDS held by running jobs on the machine) gives the job back — pending at
once, its attempt not spent — and claims no more (``stopped_by: no_free_uid``); the job is
not the one at fault. Once a uid is free, the job runs. In process, on a real database,
as root (per-job uids need it)."""

from __future__ import annotations

import os

import pytest

from jobfence.db import Connection
from jobfence.jobuids import PerJobUsers, parse_uids
from jobfence.settings import Settings
from jobfence.store import Store
from jobfence.worker.loop import Worker
from tests.support.factories import enqueue_one

UIDS = "3999990000-3999990000"  # one uid: held by the test, none left for the worker

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-job uids need root")


def test_an_exhausted_uid_pool_gives_the_job_back_without_spending_an_attempt(
        dsn: str, store: Store, conn: Connection) -> None:
    job = enqueue_one(store, actions=[{"name": "command", "params": {"argv": ["true"]}}],
                      max_attempts=1)
    held = PerJobUsers(parse_uids(UIDS)).take()  # as another worker's running job would
    try:
        report = Worker(Settings(database_url=dsn, command_uids=UIDS)).run(5)
    finally:
        held.release()
    assert (report.claimed, report.given_back, report.failed, report.retried) == (1, 1, 0, 0)
    assert report.stopped_by == "no_free_uid" and not report.ok
    row = conn.execute("SELECT status, attempt_count, reason FROM jobs WHERE job_id = %s",
                       (job,)).fetchone()
    assert row is not None and (row["status"], row["attempt_count"]) == ("pending", 0)
    assert "uid" in row["reason"]
    # a uid free again: the job runs, on its one attempt
    report = Worker(Settings(database_url=dsn, command_uids=UIDS)).run(5)
    assert (report.claimed, report.succeeded, report.ok) == (1, 1, True)
