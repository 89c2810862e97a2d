"""Each group role, connected directly as a login of it, against the real server: what it
may do and what it is refused (invariant 9). Every statement runs in a transaction that is
rolled back, so the table is read the same whatever order it runs in.

The worker's row is the point of the exercise: it reaches no table at all — not even to
read — and runs only the fenced functions, which match nothing without the attempt's
fence and never hand out another job's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import LiteralString
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.rows import dict_row

from devtools.roles import ensure_logins
from jobfence.store import Store
from jobfence.store.queues import scaler_query
from jobfence.store.roles import KINDS
from tests.support import Dsn
from tests.support.factories import enqueue_one

NOT_MINE = str(uuid4())

STATEMENTS: dict[str, LiteralString] = {
    "read a job's fence": "SELECT attempt_id FROM jobfence.jobs LIMIT 1",
    "read the audit trail": "SELECT count(*) FROM jobfence.job_events",
    "read function runs": "SELECT count(*) FROM jobfence.function_runs",
    "enqueue (insert a job)": "INSERT INTO jobfence.jobs (job_id, status, actions, "
                              "max_attempts) VALUES (gen_random_uuid(), 'pending', '[]', 3)",
    "forge a finished job": "INSERT INTO jobfence.jobs (job_id, status, actions, "
                            "max_attempts, attempt_count, finished_at) VALUES "
                            "(gen_random_uuid(), 'succeeded', '[]', 3, 1, now())",
    "mark a running job succeeded": "UPDATE jobfence.jobs SET status = 'succeeded', "
                                    "finished_at = now() WHERE job_id = %(job)s",
    "cancel a job (its function)": "SELECT * FROM jobfence.operator_cancel(%(job)s, 'x')",
    "switch drain mode (its function)": "SELECT * FROM jobfence.operator_set_drain(true, "
                                        "'x', 'someone')",
    "pause a queue (its function)": "SELECT jobfence.operator_configure_queue('q', true, "
                                    "false, NULL, 'x', 'someone')",
    "confirm a stopped command": "SELECT jobfence.worker_stopped(%(job)s, %(not_mine)s)",
    "delete jobs": "DELETE FROM jobfence.jobs WHERE job_id = %(job)s",
    "forge an audit event": "INSERT INTO jobfence.job_events (job_id, to_status, reason) "
                            "VALUES (%(job)s, 'succeeded', 'forged')",
    "delete the audit trail": "DELETE FROM jobfence.job_events",
    "switch drain mode": "UPDATE jobfence.jobfence_control SET draining = true",
    "pause a queue": "INSERT INTO jobfence.queues (name, paused) VALUES ('q', true)",
    "record a function run": "INSERT INTO jobfence.function_runs (function, status) "
                             "VALUES ('sweeper', 'running')",
    "record how late lifecycle was": "INSERT INTO jobfence.job_metric_deltas (queue, name, "
                                     "label, le, value) SELECT 'q', o.name, 'timeout', o.le, "
                                     "o.value FROM jobfence.jobfence_observation("
                                     "'lifecycle_lag', 'lag', 3) o",
    "reclaim expired leases": "SELECT * FROM jobfence.jobfence_reclaim("
                              "ARRAY[%(job)s]::uuid[], ARRAY['x'], ARRAY['x'], 1, 1)",
    "settle dependents": "SELECT * FROM jobfence.settle_dependents(ARRAY[%(job)s]::uuid[], 10)",
    "claim a job": "SELECT job_id FROM jobfence.worker_claim('other', 'w', 30, 1)",
    "heartbeat without the fence": "SELECT jobfence.worker_heartbeat(%(job)s, %(not_mine)s, 30)",
    "finish without the fence": "SELECT * FROM jobfence.worker_finish(%(job)s, %(not_mine)s, "
                                "'succeeded', 'x', NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                                "NULL, NULL)",
    "ask where a job's fence stands": "SELECT * FROM jobfence.worker_fence(%(job)s, "
                                      "%(not_mine)s)",
    "read the installation's identity": "SELECT * FROM jobfence.jobfence_identity()",
    "run a pool's trigger query": scaler_query("jobfence", "default").replace("%", "%%"),
    "create a table in the schema": "CREATE TABLE jobfence.intruder (a int)",
    "drop a table": "DROP TABLE jobfence.job_events",
    "alter a worker function": "ALTER FUNCTION jobfence.worker_fence(uuid, uuid) "
                               "SECURITY INVOKER",
    "retry in bulk (its function)": "SELECT * FROM jobfence.operator_retry_many("
                                    "ARRAY[%(job)s]::uuid[], 'x')",
    "cancel in bulk (its function)": "SELECT * FROM jobfence.operator_cancel_many("
                                     "ARRAY[%(job)s]::uuid[], 'x')",
    "read env values (its function)": "SELECT jobfence.operator_reveal_env(%(job)s, 'a', 'x')",
    "add a schedule (its function)": (
        "SELECT * FROM jobfence.operator_schedule_add('s', '* * * * *', 'UTC', "
        "'{\"actions\": [{\"name\": \"sleep\"}]}', '{\"actions\": [{\"name\": \"sleep\", "
        "\"params\": {}}], \"resource\": null, \"priority\": 0, \"max_attempts\": 3, "
        "\"labels\": {\"jobfence.io/schedule\": \"s\"}, \"ttl_seconds\": null, "
        "\"timeout_seconds\": null, \"expires_in_seconds\": null, \"queue\": \"default\", "
        "\"spec_hash\": \"" "00000000000000000000000000000000"
        "00000000000000000000000000000000\", \"delay_seconds\": null}', now(), 'someone')"),
    "add a schedule": "INSERT INTO jobfence.schedules (name, cron, timezone, spec, job, "
                      "next_tick_at) VALUES ('s', '* * * * *', 'UTC', '{}', '{}', now())",
    "fire a schedule's tick (its function)": "SELECT * FROM jobfence.scheduler_fire("
                                             "ARRAY[]::uuid[], ARRAY[]::timestamptz[], "
                                             "ARRAY[]::timestamptz[], ARRAY[]::timestamptz[], "
                                             "ARRAY[]::uuid[], ARRAY[]::text[])",
    "forget a tick": "DELETE FROM jobfence.schedule_ticks",
}

READS = {"read a job's fence", "read the audit trail", "read function runs",
         "read the installation's identity"}
WORKER = {"claim a job", "heartbeat without the fence", "finish without the fence",
          "ask where a job's fence stands", "read the installation's identity",
          "settle dependents", "confirm a stopped command"}
ALLOWED: dict[str, set[str]] = {
    "owner": set(STATEMENTS),
    "worker": WORKER,
    "maintainer": READS | {"mark a running job succeeded", "delete jobs",
                           "delete the audit trail", "record a function run",
                           "record how late lifecycle was",
                           "reclaim expired leases", "settle dependents",
                           "fire a schedule's tick (its function)", "forget a tick"},
    # Its writes go through the functions of its commands: never a table-wide UPDATE, and
    # a job it inserts is born the way an enqueue makes one.
    "operator": READS | {"enqueue (insert a job)", "cancel a job (its function)",
                         "switch drain mode (its function)", "pause a queue (its function)",
                         "settle dependents", "retry in bulk (its function)",
                         "cancel in bulk (its function)", "read env values (its function)",
                         "add a schedule (its function)"},
    "reader": READS | {"run a pool's trigger query"},
    # KEDA's login: the trigger query, nothing else (not even a job's fence or its events).
    "scaler": {"run a pool's trigger query"},
}
for _kind in ("owner", "maintainer", "operator"):
    ALLOWED[_kind] |= {"run a pool's trigger query"}


@pytest.fixture
def logins(dsn: Dsn) -> dict[str, str]:
    return ensure_logins(dsn.direct)


@pytest.fixture
def running(store: Store) -> Iterator[UUID]:
    job_id = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=300)
    assert claim.job_id == job_id
    yield job_id


def outcome(url: str, statement: LiteralString, job: UUID) -> str:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        try:
            with conn.transaction(force_rollback=True):
                conn.execute(statement, {"job": job, "not_mine": NOT_MINE})
        except psycopg.errors.InsufficientPrivilege:
            return "refused"
        except psycopg.errors.CheckViolation as exc:
            if exc.diag.constraint_name != "jobs_born_fresh":
                raise
            return "refused"
    return "allowed"


@pytest.mark.parametrize("kind", KINDS)
def test_each_role_may_do_its_functions_work_and_nothing_else(
        kind: str, logins: dict[str, str], running: UUID) -> None:
    table = {name: outcome(logins[kind], stmt, running) for name, stmt in STATEMENTS.items()}
    expected = {name: "allowed" if name in ALLOWED[kind] else "refused" for name in STATEMENTS}
    assert table == expected


def test_without_the_fence_the_worker_functions_match_nothing_and_tell_nothing(
        logins: dict[str, str], running: UUID, store: Store) -> None:
    with psycopg.connect(logins["worker"], autocommit=True, row_factory=dict_row) as conn:
        args = {"job": running, "not_mine": NOT_MINE}
        assert conn.execute("SELECT jobfence.worker_heartbeat(%(job)s, %(not_mine)s, 30) AS t",
                            args).fetchone() == {"t": None}
        assert conn.execute(STATEMENTS["finish without the fence"], args).fetchall() == []
        # An attempt that never held the job is told nothing; a NULL one never holds.
        assert conn.execute(STATEMENTS["ask where a job's fence stands"], args).fetchall() == []
        assert conn.execute("SELECT * FROM jobfence.worker_fence(%(job)s, NULL)",
                            args).fetchall() == []
        assert conn.execute("SELECT jobfence.worker_stopped(%(job)s, %(not_mine)s) AS s",
                            args).fetchone() == {"s": False}
        assert conn.execute("SELECT * FROM jobfence.worker_done_actions(%(job)s, %(not_mine)s)",
                            args).fetchall() == []
    job = store.jobs.get(running)
    assert job is not None and job.status == "running"


def test_a_function_cannot_be_swapped_through_the_search_path(logins: dict[str, str],
                                                              running: UUID,
                                                              store: Store) -> None:
    """The worker's functions run as their owner with a fixed search path (pg_temp last):
    a caller's temporary table named like ours is never what they read."""
    job = store.jobs.get(running)
    assert job is not None
    holder = job.attempt_id
    with psycopg.connect(logins["worker"], autocommit=True, row_factory=dict_row) as conn:
        conn.execute("CREATE TEMPORARY TABLE jobs (job_id uuid, status text, "
                     "attempt_id uuid, reason text)")
        conn.execute("INSERT INTO pg_temp.jobs VALUES (%s, 'pending', %s, 'fake')",
                     (running, NOT_MINE))
        conn.execute("SET search_path = pg_temp, jobfence")
        [row] = conn.execute("SELECT * FROM jobfence.worker_fence(%s, %s)",
                             (running, holder)).fetchall()
    assert row == {"status": "running", "holds": True, "reason": "claimed by w"}
