"""``enqueue --spec`` with a list read as a stream, on a real PostgreSQL: any length, written
batch by batch in one transaction — all or nothing however late a spec is refused, the keys
and the dependencies exact across batches — and an outcome lost at the commit or between
batches resolved from the spool, every job once."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobfence import cli
from jobfence.db import Connection
from jobfence.settings import Settings
from jobfence.spec import JobSpec
from jobfence.spec_stream import BATCH, spec_batches, spec_items
from jobfence.store import Enqueued
from jobfence.submit import submit_stream
from tests.support import lose_next_answer, run_cli

SLEEP = {"actions": [{"name": "sleep", "params": {"seconds": 0}}]}


def specs(n: int, **extra: object) -> list[dict[str, object]]:
    return [{**SLEEP, "labels": {"n": str(i)}, **extra} for i in range(n)]


def counts(conn: Connection) -> tuple[int, int]:
    row = conn.execute("SELECT (SELECT count(*) FROM jobs) AS jobs, "
                       "(SELECT count(*) FROM job_events) AS events").fetchone()
    assert row is not None
    return row["jobs"], row["events"]


def test_a_list_longer_than_a_hundred_thousand_is_enqueued_whole_and_in_order(
        dsn: str, conn: Connection, tmp_path: Path) -> None:
    n = 100_001  # past the count a list held whole may have
    (tmp_path / "specs.json").write_text(json.dumps(specs(n)))
    r = run_cli(dsn, "enqueue", "--spec", str(tmp_path / "specs.json"), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = [json.loads(line)["job_id"] for line in r.stdout.splitlines()]
    rows = {str(r["job_id"]): int(r["n"])
            for r in conn.execute("SELECT job_id, labels->>'n' AS n FROM jobs")}
    assert [rows[job_id] for job_id in printed] == list(range(n))  # each once, in order
    assert counts(conn) == (n, n)


@pytest.mark.parametrize("where", ["last", "a duplicate key"])
def test_a_spec_refused_late_in_a_long_list_leaves_nothing_written(
        dsn: str, conn: Connection, tmp_path: Path, where: str) -> None:
    listed = specs(2 * BATCH + 10)
    if where == "last":
        listed[-1] = {**SLEEP, "priority": "high"}
        said = f"spec #{len(listed) - 1}: priority"
    else:
        listed[3]["idempotency_key"] = listed[-2]["idempotency_key"] = "once"
        said = f"spec #{len(listed) - 2}: idempotency key appears twice in one call"
    r = run_cli(dsn, "enqueue", "--spec", "-", input="\n".join(json.dumps(s) for s in listed))
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert said in r.stderr
    assert counts(conn) == (0, 0)


def test_keys_and_dependencies_stay_exact_across_batches(dsn: str, conn: Connection) -> None:
    first = run_cli(dsn, "enqueue", "--spec", "-",
                    input=json.dumps([{**SLEEP, "idempotency_key": "k1"}, SLEEP]))
    assert first.returncode == 0, first.stderr
    keyed, before = (json.loads(line)["job_id"] for line in first.stdout.splitlines())
    conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() "
                 "WHERE job_id = %s", (before,))
    listed = specs(BATCH + 50)
    listed[BATCH + 5] = {**SLEEP, "idempotency_key": "k1"}           # a replay, batch 2
    listed[BATCH + 6] = {**SLEEP, "after": [before]}                 # its dependency done
    listed[7] = {**SLEEP, "after": [keyed]}                          # still waiting
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(listed))
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(out) == len(listed)
    assert out[BATCH + 5] == {"job_id": keyed, "status": "pending", "created": False}
    assert out[BATCH + 6]["status"] == "pending"
    assert out[7]["status"] == "waiting"
    assert counts(conn)[0] == 2 + len(listed) - 1


def assert_each_once_in_order(conn: Connection, made: list[Enqueued]) -> None:
    rows = {r["job_id"]: int(r["n"])
            for r in conn.execute("SELECT job_id, labels->>'n' AS n FROM jobs")}
    assert len(rows) == len(made)
    assert [rows[a.job_id] for a in made] == list(range(len(made)))


def batched(n: int, size: int) -> Iterator[list[JobSpec]]:
    return spec_batches(spec_items(io.BytesIO(json.dumps(specs(n)).encode())), size=size)


@pytest.mark.parametrize("abort", [False, True], ids=["committed", "never-committed"])
def test_a_streamed_enqueue_whose_commit_answer_was_lost_makes_each_job_once(
        dsn: str, conn: Connection, abort: bool) -> None:
    settings = Settings(database_url=dsn)
    first = cli.connect_store(settings, "enqueue")
    cut = lose_next_answer(conn, first, abort=abort)
    try:
        made = [a for answers in submit_stream(
            settings, first, batched(25, 10),
            reopen=lambda: cli.connect_store(settings, "enqueue")) for a in answers]
    finally:
        cut.join()
        first.conn.close()
    assert_each_once_in_order(conn, made)


def test_a_connection_lost_between_batches_sends_every_batch_once(
        dsn: str, conn: Connection) -> None:
    settings = Settings(database_url=dsn)
    first = cli.connect_store(settings, "enqueue")
    pid = first.conn.info.backend_pid

    def cut_after_two() -> Iterator[list[JobSpec]]:
        for i, batch in enumerate(batched(45, 10)):
            if i == 2:  # the first two are in, uncommitted: the connection goes
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                time.sleep(0.2)
            yield batch

    done = threading.Event()
    try:
        made = [a for answers in submit_stream(
            settings, first, cut_after_two(),
            reopen=lambda: cli.connect_store(settings, "enqueue")) for a in answers]
        done.set()
    finally:
        first.conn.close()
    assert done.is_set()
    assert_each_once_in_order(conn, made)
    assert counts(conn) == (45, 45)
