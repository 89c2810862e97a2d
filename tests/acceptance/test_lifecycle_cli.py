"""`jobfence lifecycle` as a subprocess: one JSON summary, its run recorded, a second
concurrent run skipping with exit 0, bad settings refused with exit 2; a running job whose
run deadline passed has its child killed and its worker exit 1 while the job is retried or
failed; S3 deletes denied by a bucket policy (moto) keep the rows until a later pass can
delete the objects. Also: `enqueue` reads every ISO 8601 duration form and refuses garbage
with exit 2, writing nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest

from devtools.sqlconn import connect
from jobfence.adapters.s3 import S3ObjectStore
from jobfence.objectstore import job_prefix
from jobfence.store import Store
from tests.support import run_cli
from tests.support.factories import run_in_progress
from tests.support.procs import FAST, alive, enqueue, job, log_events, read_pid, spawn, wait_for

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

COUNTS = ("timed_out_retried", "timed_out_failed", "expired_cancelled", "dependents_failed",
          "parents_finalized", "retention_jobs_deleted", "retention_children_deleted",
          "retention_objects_deleted", "retention_failures", "events_deleted",
          "control_events_deleted", "function_runs_deleted", "function_triggers_deleted",
          "schedule_ticks_deleted", "batches", "longest_batch_seconds")


def lifecycle(dsn: str, **env: str) -> dict[str, Any]:
    r = run_cli(dsn, "lifecycle", **{**FAST, **env})
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def lifecycle_until_timed_out(dsn: str) -> dict[str, Any]:
    """A pass skips a row another transaction holds for a moment (SKIP LOCKED: the worker's
    heartbeat); the next pass takes it. Passes until one times the job out."""
    for _ in range(10):
        out = lifecycle(dsn)
        if out["timed_out_retried"] or out["timed_out_failed"]:
            return out
    raise AssertionError("no lifecycle pass timed the job out")


def sql(dsn: str, statement: str, *params: object) -> None:
    with connect(dsn) as conn:
        conn.execute(statement, params)  # type: ignore[arg-type]


def test_a_pass_prints_one_json_summary_and_records_its_run(dsn: str) -> None:
    out = lifecycle(dsn)
    assert out["function"] == "lifecycle" and "duration_seconds" in out
    assert all(key in out for key in COUNTS), out
    with connect(dsn) as conn:
        row = conn.execute("SELECT status, counts FROM function_runs "
                           "WHERE function = 'lifecycle'").fetchone()
    assert row is not None and row["status"] == "succeeded"
    assert row["counts"]["retention_jobs_deleted"] == 0


def test_a_second_concurrent_run_skips_and_exits_0(dsn: str) -> None:
    with connect(dsn) as holder:
        run_in_progress(Store(holder), "lifecycle")  # a first run in progress
        r = run_cli(dsn, "lifecycle")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"function": "lifecycle", "skipped": True}


@pytest.mark.parametrize("variable", ["JOBFENCE_RETENTION_DEFAULT", "JOBFENCE_AUDIT_RETENTION",
                                      "JOBFENCE_FUNCTION_RUNS_RETENTION"])
def test_a_retention_setting_that_is_not_a_duration_is_exit_2(dsn: str, variable: str) -> None:
    r = run_cli(dsn, "lifecycle", **{variable: "30 days"})
    assert r.returncode == 2 and r.stdout == ""
    assert variable in r.stderr and "ISO 8601" in r.stderr


@contextmanager
def running_past_its_deadline(dsn: str, tmp_path: Path,
                              max_attempts: int) -> Iterator[tuple[str, Popen[str], int]]:
    """A job running in a worker (its child's pid written to a file) whose run deadline has
    just passed: (job id, worker, child pid). The worker is killed on the way out if it is
    still running."""
    pidfile = tmp_path / "pid"
    argv = {"argv": ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"]}
    # A long timeout: the worker's own local deadline stays far away, so what stops the
    # child here is the lifecycle pass rotating the fence.
    job_id = enqueue(dsn, "command:" + json.dumps(argv), "--timeout", "PT1H",
                     "--max-attempts", str(max_attempts))
    worker = spawn(dsn, "worker")
    try:
        child = read_pid(pidfile)
        sql(dsn, "UPDATE jobs SET run_deadline_at = now() - interval '1 second' "
                 "WHERE job_id = %s", job_id)
        yield job_id, worker, child
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()


def test_run_timeout_kills_the_child_and_the_job_is_retried(dsn: str, tmp_path: Path) -> None:
    with running_past_its_deadline(dsn, tmp_path, max_attempts=2) as (job_id, worker, child):
        attempt = job(dsn, job_id)["attempt_id"]
        out = lifecycle_until_timed_out(dsn)
        assert (out["timed_out_retried"], out["timed_out_failed"]) == (1, 0)
        stdout, stderr = worker.communicate(timeout=15)
    assert worker.returncode == 1, stderr
    assert json.loads(stdout)["lost"] == 1
    wait_for(lambda: not alive(child), timeout=5)
    [stale] = [e for e in log_events(stderr) if e.get("event") == "writeback_stale_attempt"]
    assert stale["attempt_id"] == str(attempt) and "timed out" in stale["why"]
    row = job(dsn, job_id)
    assert (row["status"], row["attempt_count"], row["error"]) == ("pending", 1, "timed out")
    assert row["attempt_id"] is None


def test_run_timeout_on_the_last_attempt_fails_the_job(dsn: str, tmp_path: Path) -> None:
    with running_past_its_deadline(dsn, tmp_path, max_attempts=1) as (job_id, worker, child):
        assert lifecycle_until_timed_out(dsn)["timed_out_failed"] == 1
        worker.communicate(timeout=15)
    assert worker.returncode == 1
    wait_for(lambda: not alive(child), timeout=5)
    row = job(dsn, job_id)
    assert (row["status"], row["error"]) == ("failed", "timed out")
    r = run_cli(dsn, "status", job_id, "-o", "json")
    assert json.loads(r.stdout)["status"] == "failed"


def test_denied_s3_deletes_keep_the_rows_until_a_later_pass(
        dsn: str, s3_env: dict[str, str]) -> None:
    write = 'echo result > "$JOBFENCE_OUTPUT_DIR/result.txt"'
    job_id = enqueue(dsn, "command:" + json.dumps({"argv": ["sh", "-c", write]}),
                     "--ttl", "PT1H", **s3_env)
    r = run_cli(dsn, "worker", **{**FAST, **s3_env})
    assert r.returncode == 0, r.stderr
    s3, bucket = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"]), \
        s3_env["JOBFENCE_S3_BUCKET"]
    with connect(dsn) as conn:
        mine = str(Store(conn).control.identity().installation)
    prefix = job_prefix(mine, job(dsn, job_id)["job_id"])
    assert len(list(s3.iter_objects(bucket, prefix))) == 1
    sql(dsn, "UPDATE jobs SET retain_until = now() - interval '1 second' WHERE job_id = %s",
        job_id)
    deny = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject",
        "Resource": f"arn:aws:s3:::{bucket}/*"}]}
    s3.client.put_bucket_policy(Bucket=bucket, Policy=json.dumps(deny))
    r = run_cli(dsn, "lifecycle", **{**FAST, **s3_env})
    assert r.returncode == 0, r.stderr  # a per-job failure is logged, the pass ran
    out = json.loads(r.stdout)
    assert (out["retention_failures"], out["retention_jobs_deleted"]) == (1, 0)
    [logged] = [e for e in log_events(r.stderr)
                if e.get("event") == "retention_objects_not_deleted"]
    assert logged["job_id"] == job_id and "AccessDenied" in logged["error"]
    assert job(dsn, job_id)["status"] == "succeeded"
    with connect(dsn) as conn:
        outputs = conn.execute("SELECT count(*) AS n FROM job_outputs WHERE job_id = %s",
                               (job_id,)).fetchone()
    assert outputs is not None and outputs["n"] == 1
    assert len(list(s3.iter_objects(bucket, prefix))) == 1
    s3.client.delete_bucket_policy(Bucket=bucket)
    out = lifecycle(dsn, **s3_env)
    assert (out["retention_failures"], out["retention_jobs_deleted"]) == (0, 1)
    assert out["retention_objects_deleted"] == 1
    assert list(s3.iter_objects(bucket, prefix)) == []
    assert run_cli(dsn, "status", job_id).returncode == 5


@pytest.mark.parametrize(("flag", "text", "seconds"), [
    ("--ttl", "PT1H30M", 5400), ("--timeout", "P1DT12H", 129600),
    ("--timeout", "PT0.5S", 0.5), ("--ttl", "P2W", 1209600), ("--expires-in", "P7D", 604800),
])
def test_enqueue_reads_every_iso_8601_duration_form(dsn: str, flag: str, text: str,
                                                   seconds: float) -> None:
    job_id = enqueue(dsn, 'sleep:{"seconds": 0}', flag, text)
    row = job(dsn, job_id)
    if flag == "--expires-in":
        assert abs((row["expires_at"] - row["created_at"]).total_seconds() - seconds) < 5
    else:
        assert row[flag.removeprefix("--")].total_seconds() == seconds


@pytest.mark.parametrize(("flag", "text"), [
    ("--ttl", "7 days"), ("--timeout", "90"), ("--expires-in", "PT"), ("--timeout", "-PT1H"),
    ("--expires-in", "P1Y2X"),
])
def test_enqueue_refuses_a_duration_that_is_not_iso_8601(dsn: str, flag: str, text: str) -> None:
    r = run_cli(dsn, "enqueue", 'sleep:{"seconds": 0}', f"{flag}={text}")
    assert r.returncode == 2 and r.stdout == ""
    field = flag.removeprefix("--").replace("-", "_")
    assert f"{field}:" in r.stderr and "ISO 8601" in r.stderr, r.stderr
    with connect(dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM jobs").fetchone()
    assert row is not None and row["n"] == 0
