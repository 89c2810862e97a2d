"""The snooze write (worker_snooze) on a real database: it gives the job back under its
fence, visible after the delay, the attempt not spent and the snooze counted and audited;
a stale attempt's snooze matches nothing; past the bound the job fails saying why; the
next claim knows it may resume; the worker's role may run it and the bounds hold."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobfence.db import Connection
from jobfence.errors import JobfenceError
from jobfence.store import Store
from tests.support.factories import enqueue_one


def _claim(store: Store):  # type: ignore[no-untyped-def]
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
    return claim


def test_a_snooze_gives_the_job_back_without_spending_the_attempt(store: Store,
                                                                  conn: Connection) -> None:
    job_id = enqueue_one(store)
    claim = _claim(store)
    assert claim.attempt_count == 1 and not claim.may_resume
    t = store.attempts.snooze(job_id=job_id, attempt_id=claim.attempt_id, delay_seconds=30,
                              reason="snoozed for PT30S by action 1 (command)", max_snoozes=5)
    assert t is not None and t.status == "pending"
    row = conn.execute("SELECT *, visible_at - now() AS wait FROM jobs WHERE job_id = %s",
                       (job_id,)).fetchone()
    assert row is not None
    assert (row["status"], row["attempt_count"], row["snoozes"], row["attempt_id"]) == (
        "pending", 0, 1, None)
    assert timedelta(seconds=29) < row["wait"] <= timedelta(seconds=30)
    assert row["claimed_by"] is None and row["error"] is None
    [event] = conn.execute("SELECT * FROM job_events WHERE job_id = %s AND from_status = "
                           "'running'", (job_id,)).fetchall()
    assert (event["to_status"], event["attempt_id"], event["reason"]) == (
        "pending", claim.attempt_id, "snoozed for PT30S by action 1 (command)")
    assert store.attempts.claim(worker_id="w", lease_seconds=60) == []  # not before its time
    conn.execute("UPDATE jobs SET visible_at = now() WHERE job_id = %s", (job_id,))
    again = _claim(store)
    assert again.attempt_count == 1 and again.may_resume  # a snooze may follow done actions
    assert store.jobs.get(job_id).snoozes == 1  # type: ignore[union-attr]


def test_a_stale_attempts_snooze_matches_nothing(store: Store, conn: Connection) -> None:
    job_id = enqueue_one(store)
    stale = _claim(store)
    conn.execute("UPDATE jobs SET visible_at = now() - interval '1 s' WHERE job_id = %s",
                 (job_id,))  # its lease ran out
    before = conn.execute("SELECT * FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert store.attempts.snooze(job_id=job_id, attempt_id=stale.attempt_id, delay_seconds=5,
                                 reason="snoozed", max_snoozes=5) is None
    conn.execute("UPDATE jobs SET status = 'pending', attempt_id = NULL, visible_at = now(), "
                 "attempt_count = 0 WHERE job_id = %s", (job_id,))  # as a reclaim leaves it
    fresh = _claim(store)
    assert store.attempts.snooze(job_id=job_id, attempt_id=stale.attempt_id, delay_seconds=5,
                                 reason="snoozed", max_snoozes=5) is None
    row = conn.execute("SELECT * FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None and before is not None
    assert (row["status"], row["attempt_id"], row["snoozes"]) == ("running",
                                                                  fresh.attempt_id, 0)


def test_past_the_bound_a_snooze_fails_the_job_saying_why(store: Store,
                                                          conn: Connection) -> None:
    job_id = enqueue_one(store, max_attempts=3)
    for n in range(2):
        claim = _claim(store)
        t = store.attempts.snooze(job_id=job_id, attempt_id=claim.attempt_id,
                                  delay_seconds=0.001, reason=f"snooze {n}", max_snoozes=2)
        assert t is not None and t.status == "pending"
        conn.execute("UPDATE jobs SET visible_at = now() WHERE job_id = %s", (job_id,))
    claim = _claim(store)
    t = store.attempts.snooze(job_id=job_id, attempt_id=claim.attempt_id, delay_seconds=1,
                              reason="snoozed for PT1S by action 1 (command)", max_snoozes=2)
    assert t is not None and t.status == "failed"
    row = conn.execute("SELECT * FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None
    assert row["error"] == ("snoozed 2 times, the most a job may (asked again: snoozed for "
                            "PT1S by action 1 (command))")
    assert (row["attempt_count"], row["snoozes"]) == (1, 2)
    assert row["finished_at"] is not None


@pytest.mark.parametrize("delay", [0, -1, 86_401, float("nan")])
def test_a_delay_out_of_bounds_is_refused_by_the_database(store: Store, delay: float) -> None:
    job_id = enqueue_one(store)
    claim = _claim(store)
    with pytest.raises(JobfenceError, match="delay_seconds"):
        store.attempts.snooze(job_id=job_id, attempt_id=claim.attempt_id, delay_seconds=delay,
                              reason="x", max_snoozes=5)


def test_a_new_job_is_born_without_snoozes(store: Store, conn: Connection) -> None:
    job_id = enqueue_one(store)
    assert store.jobs.get(job_id).snoozes == 0  # type: ignore[union-attr]


def test_a_retried_job_may_snooze_again(store: Store) -> None:
    """Failed for snoozing too often, retried by an operator: its snoozes start afresh."""
    job_id = enqueue_one(store)
    for _ in range(2):
        [claim] = store.attempts.claim(worker_id="w", lease_seconds=60)
        store.attempts.snooze(job_id=job_id, attempt_id=claim.attempt_id, delay_seconds=0.001,
                              reason="later", max_snoozes=1)
        store.conn.execute("UPDATE jobs SET visible_at = now() WHERE job_id = %s", (job_id,))
    row = store.jobs.get(job_id)
    assert row is not None and row.status == "failed"
    store.jobs.retry(job_id=job_id, reason="try again")
    row = store.jobs.get(job_id)
    assert row is not None and (row.status, row.snoozes) == ("pending", 0)


def test_a_snoozed_claims_output_is_kept_with_its_snooze(store: Store) -> None:
    from datetime import UTC, datetime

    from jobfence.joblogs import Logs
    from jobfence.store.types import ActionOutcome
    from jobfence.views import job_views

    job_id = enqueue_one(store)
    claim = _claim(store)
    said = {"exit_code": 75, "stdout_tail": "table locked, later\n", "stdout_bytes": 20,
            "stderr_tail": "", "stderr_bytes": 0}
    t = store.attempts.snooze(job_id=job_id, attempt_id=claim.attempt_id, delay_seconds=30,
                              reason="snoozed for PT30S by action 1 (sleep)", max_snoozes=5,
                              outcome=ActionOutcome(0, "sleep", False, datetime.now(UTC),
                                                    result=said, snoozed=True))
    assert t is not None and t.status == "pending"
    [result] = store.jobs.action_results([job_id])
    assert (result.attempt_id, result.status, result.result) == (claim.attempt_id, "snoozed",
                                                                said)
    row = store.jobs.get(job_id)
    assert row is not None
    [view] = job_views(store, [row])
    assert view["actions"][0]["status"] == "snoozed"
    assert view["actions"][0]["result"]["stdout_tail"] == "table locked, later\n"
    logs = Logs(store, None, None, "x")
    attempt = logs.attempt(job_id)
    [out, _err] = logs.pieces(job_id, attempt)
    assert out.tail == "table locked, later\n" and out.whole
    # It is not done: the next claim runs it again.
    store.conn.execute("UPDATE jobs SET visible_at = now() WHERE job_id = %s", (job_id,))
    again = _claim(store)
    assert store.attempts.done_actions(job_id, again.attempt_id) == set()


def test_a_stale_attempts_snooze_records_no_outcome(store: Store, conn: Connection) -> None:
    from datetime import UTC, datetime

    from jobfence.store.types import ActionOutcome

    job_id = enqueue_one(store)
    stale = _claim(store)
    conn.execute("UPDATE jobs SET visible_at = now() - interval '1 s' WHERE job_id = %s",
                 (job_id,))
    assert store.attempts.snooze(job_id=job_id, attempt_id=stale.attempt_id, delay_seconds=5,
                                 reason="snoozed", max_snoozes=5,
                                 outcome=ActionOutcome(0, "sleep", False, datetime.now(UTC),
                                                       result={"x": 1}, snoozed=True)) is None
    assert store.jobs.action_results([job_id]) == []
