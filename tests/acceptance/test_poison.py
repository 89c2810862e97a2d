"""One unlucky job must not break the promise for the others: every input a spec, a flag or
a setting can carry is bounded to what PostgreSQL and the OS can hold (refused with exit 2,
nothing written), and nothing a job produces can fail its own terminal write, stall the
claims, or make a finished command run again. Each test is a reproduction of a report,
through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from devtools.sqlconn import connect
from tests.support import JOBFENCE, REPO, cli_env, run_cli
from tests.support.procs import FAST, action_results, alive, enqueue, job, read_pid, spawn, wait_for

SLEEP0 = 'sleep:{"seconds": 0}'


def counts(dsn: str) -> tuple[int, int, int]:
    """Rows that any write would add: jobs, audit events, dependencies."""
    with connect(dsn) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM jobs) AS j, "
                           "(SELECT count(*) FROM job_events) AS e, "
                           "(SELECT count(*) FROM job_dependencies) AS d").fetchone()
    assert row is not None
    return row["j"], row["e"], row["d"]


def refused(dsn: str, *args: str, input: str | None = None, **env: str) -> str:
    """Run the CLI, expect exit 2 with one error line and nothing written; the line."""
    before = counts(dsn)
    r = run_cli(dsn, *args, input=input, **env)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("jobfence: error:")]
    assert len(lines) == 1, r.stderr
    assert counts(dsn) == before
    return lines[0]


# -- 1. durations that overflow PostgreSQL --------------------------------------------------


@pytest.mark.parametrize("flag", ["--timeout", "--ttl", "--expires-in"])
def test_a_duration_past_a_century_is_refused_and_the_queue_keeps_flowing(
        dsn: str, flag: str) -> None:
    line = refused(dsn, "enqueue", SLEEP0, flag, "P999999Y")
    assert "100 years" in line
    ids = [enqueue(dsn, SLEEP0) for _ in range(2)]
    r = run_cli(dsn, "worker", "--max-jobs", "5", **FAST)
    assert r.returncode == 0, r.stderr
    assert all(job(dsn, i)["status"] == "succeeded" for i in ids)


def test_the_database_itself_refuses_an_unbounded_duration(dsn: str) -> None:
    """Defence in depth: a row written around the validation cannot poison the claim."""
    with connect(dsn) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO jobs (job_id, status, actions, max_attempts, timeout) "
                     "VALUES (gen_random_uuid(), 'pending', '[]', 1, interval '1000 years')")


def test_a_timeout_inside_a_century_still_claims(dsn: str) -> None:
    job_id = enqueue(dsn, SLEEP0, "--timeout", "P99Y", "--ttl", "P100Y")
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 0, r.stderr
    assert job(dsn, job_id)["status"] == "succeeded"


# -- 2. output that PostgreSQL cannot hold --------------------------------------------------


def test_binary_output_never_makes_a_finished_command_run_again(
        dsn: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    script = f"echo run >> {runs}; printf 'a\\000b'; head -c 64 /dev/urandom >&2"
    job_id = enqueue(dsn, "command:" + json.dumps({"argv": ["bash", "-c", script]}),
                     "--max-attempts", "3")
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 0, r.stderr
    row = job(dsn, job_id)
    assert row["status"] == "succeeded" and row["attempt_count"] == 1
    assert runs.read_text() == "run\n"
    [result] = action_results(dsn, job_id)
    assert result["result"]["stdout_tail"] == "a\ufffdb"
    r = run_cli(dsn, "sweeper", **FAST)  # nothing left for it
    assert json.loads(r.stdout)["reclaimed"] == 0 and runs.read_text() == "run\n"


def test_a_terminal_write_the_database_refuses_ends_the_job_failed_not_running(
        dsn: str, tmp_path: Path) -> None:
    """Whatever the reason a terminal write is refused, the job is not left running for
    the sweeper to run it again: the worker writes `failed` with the reason, fenced."""
    with connect(dsn) as conn:
        conn.execute("""
            CREATE FUNCTION refuse_success() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.status = 'succeeded' THEN
                    RAISE EXCEPTION 'no success today' USING ERRCODE = 'check_violation';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_success BEFORE UPDATE ON jobs
                FOR EACH ROW EXECUTE FUNCTION refuse_success();""")
    runs = tmp_path / "runs"
    job_id = enqueue(dsn, "command:" + json.dumps({"argv": ["sh", "-c", f"echo x >> {runs}"]}))
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 1
    row = job(dsn, job_id)
    assert row["status"] == "failed" and "could not be stored" in row["error"]
    assert "no success today" in row["error"]
    assert runs.read_text() == "x\n"


# -- 3. one S3 failure must not stop a pass -------------------------------------------------


def test_a_missing_output_bucket_fails_the_datums_and_export_finalize_goes_on(
        dsn: str, s3_env: dict[str, str]) -> None:
    from jobfence.adapters.s3 import S3ObjectStore

    store = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"])
    bucket = s3_env["JOBFENCE_S3_BUCKET"]
    for i in range(2):
        store.put_bytes(bucket, f"in/{i}.txt", b"x")
    gone = {**s3_env, "JOBFENCE_S3_BUCKET": bucket + "-missing"}
    spec = {"actions": [{"name": "command", "params": {
        "argv": ["sh", "-c", 'echo out > "$JOBFENCE_OUTPUT_DIR/o.txt"']}}],
        "inputs": f"s3://{bucket}/in/", "max_attempts": 1}
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(spec), **gone)
    assert r.returncode == 0, r.stderr
    parent = json.loads(r.stdout)["job_id"]
    dependency = enqueue(dsn, SLEEP0)
    dependent = enqueue(dsn, SLEEP0, "--after", dependency)
    # Every child fails its upload (rows marked error, never left running), and the worker
    # that finishes the last one cannot write the manifest: it still exits with its report.
    r = run_cli(dsn, "worker", "--max-jobs", "2", **{**FAST, **gone})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["failed"] == 2
    with connect(dsn) as conn:
        statuses = {row["status"] for row in conn.execute("SELECT status FROM job_outputs")}
    assert statuses == {"error"}
    assert job(dsn, parent)["status"] == "running"
    # The dependency finished without settling (as if its worker died right after commit):
    with connect(dsn) as conn:
        conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() "
                     "WHERE job_id = %s", (dependency,))
    r = run_cli(dsn, "export-finalize", **gone)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["finalize_errors"] == 1 and report["dependents_released"] == 1
    assert job(dsn, dependent)["status"] == "pending"


# -- 5. a YAML alias bomb -------------------------------------------------------------------


def test_a_yaml_alias_bomb_is_refused_quickly(dsn: str) -> None:
    lines = ["a: &a [x,x,x,x,x,x,x,x,x]"]
    for i in range(1, 9):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [" + ",".join(["*" + prev] * 9) + "]")
    bomb = ("- " + "\n  ".join(lines)
            + "\n  actions: [{name: sleep, params: {seconds: 1, x: *i}}]\n")
    assert len(bomb) < 600
    started = time.monotonic()
    line = refused(dsn, "enqueue", "--spec", "-", input=bomb)
    assert "values once expanded" in line
    assert time.monotonic() - started < 15


# -- 6. escaped grandchildren ---------------------------------------------------------------


def test_a_daemonized_grandchild_dies_with_its_job_on_success(
        dsn: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"setsid sleep 300 & echo $! > {pidfile}"
    job_id = enqueue(dsn, "command:" + json.dumps({"argv": ["sh", "-c", script]}))
    r = run_cli(dsn, "worker", **FAST)
    assert r.returncode == 0, r.stderr
    assert job(dsn, job_id)["status"] == "succeeded"
    daemon = read_pid(pidfile)
    wait_for(lambda: not alive(daemon), timeout=3)


def test_a_daemonized_grandchild_dies_with_its_job_on_cancel(dsn: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"setsid sh -c 'sleep 300' & echo $! > {pidfile}; sleep 300"
    job_id = enqueue(dsn, "command:" + json.dumps({"argv": ["sh", "-c", script]}))
    worker = spawn(dsn, "worker")
    daemon = read_pid(pidfile)
    assert alive(daemon)
    r = run_cli(dsn, "cancel", job_id)
    assert r.returncode == 0, r.stderr
    worker.communicate(timeout=15)
    assert worker.returncode == 1
    wait_for(lambda: not alive(daemon), timeout=3)


# -- 7, 8, 9. input that used to crash or hang ---------------------------------------------


@pytest.mark.parametrize(("spec", "message"), [
    ({"actions": [{"name": "sleep", "params": {"seconds": 1}}], "resource": "a\u0000b"},
     "NUL"),
    ({"actions": [{"name": "sleep", "params": {"seconds": 1}}], "labels": {"k": "\u0000"}},
     "NUL"),
    ({"actions": [{"name": "command", "params": {"argv": ["echo", "a\u0000"]}}]}, "NUL"),
    ({"actions": [{"name": "command", "params": {"argv": ["x"], "env": {"": "v"}}}]},
     "environment variable name"),
    ({"actions": [{"name": "command", "params": {"argv": ["x"], "env": {"A=B": "v"}}}]},
     "environment variable name"),
    ({"actions": [{"name": "command", "params": {"argv": [""]}}]}, "argv"),
    ({"actions": [{"name": "sleep", "params": {"seconds": float("inf")}}]}, "JSON number"),
])
def test_specs_the_database_or_the_os_cannot_hold_are_refused(
        dsn: str, spec: dict[str, object], message: str) -> None:
    assert message in refused(dsn, "enqueue", "--spec", "-", input=json.dumps(spec))


def test_a_spec_nested_a_thousand_deep_is_refused(dsn: str) -> None:
    deep = '{"actions": [{"name": "sleep", "params": {"seconds": 1, "x": ' + "[" * 1000 \
        + "]" * 1000 + "}}]}"
    assert "nested" in refused(dsn, "enqueue", "--spec", "-", input=deep)


def test_a_binary_spec_file_is_refused(dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "spec.bin"
    path.write_bytes(bytes(range(256)) * 4)
    assert "not UTF-8" in refused(dsn, "enqueue", "--spec", str(path))


@pytest.mark.parametrize("args", [
    ["--interval", "-1"], ["--interval", "nan"], ["--timeout", "nan"], ["--timeout", "-1"],
    ["--timeout", "inf"],
])
def test_wait_refuses_intervals_and_timeouts_that_would_hang(dsn: str, args: list[str]) -> None:
    job_id = enqueue(dsn, SLEEP0)
    refused(dsn, "wait", job_id, *args)


@pytest.mark.parametrize("args", [
    [b"list", b"--resource", b"db.\xff"],
    [b"cancel", b"01900000-0000-7000-8000-000000000000", b"--reason", b"\xfe\xff"],
    [b"enqueue", b"sleep", b"--resource", b"\xc3("],
])
def test_arguments_that_are_not_utf8_are_refused(dsn: str, args: list[bytes]) -> None:
    before = counts(dsn)
    env = {k.encode(): v.encode() for k, v in cli_env(dsn).items()}
    r = subprocess.run([*(a.encode() for a in JOBFENCE), *args], env=env, cwd=REPO,
                       capture_output=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert b"not valid UTF-8" in r.stderr and b"Traceback" not in r.stderr
    assert counts(dsn) == before


@pytest.mark.parametrize("url", ["not a dsn", "postgresql://[::1", "host=a port"])
def test_a_malformed_database_url_is_a_clear_exit_2(url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    r = subprocess.run([*JOBFENCE, "list"], env={**env, "JOBFENCE_DATABASE_URL": url,
                                                 },
                       cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert "JOBFENCE_DATABASE_URL" in r.stderr and "Traceback" not in r.stderr
    assert url not in r.stderr  # it may hold a password


def test_an_unmigrated_database_says_to_run_migrate(databases) -> None:  # type: ignore[no-untyped-def]
    url = databases.create(migrated=False)
    try:
        for args in (["list"], ["enqueue", SLEEP0], ["worker"], ["sweeper"]):
            r = run_cli(url, *args)
            assert r.returncode == 2, (args, r.stderr)
            assert "run `jobfence migrate`" in r.stderr and "Traceback" not in r.stderr
    finally:
        databases.drop(url)


@pytest.mark.parametrize(("env", "message"), [
    ({"JOBFENCE_LEASE_SECONDS": "0.2"}, "JOBFENCE_LEASE_SECONDS"),
    ({"JOBFENCE_LEASE_SECONDS": "2", "JOBFENCE_HEARTBEAT_SECONDS": "1.5"},
     "JOBFENCE_HEARTBEAT_SECONDS"),
])
def test_a_lease_too_short_to_renew_is_refused_at_start(
        dsn: str, env: dict[str, str], message: str) -> None:
    job_id = enqueue(dsn, SLEEP0)
    assert message in refused(dsn, "worker", **env)
    assert job(dsn, job_id)["status"] == "pending" and job(dsn, job_id)["attempt_count"] == 0


def test_a_next_claim_that_fails_never_undoes_the_finish_it_rode_on(dsn: str) -> None:
    """A draining worker's terminal write and its next claim share a transaction. If the
    claim is refused (here: a trigger refuses to start one job), the finish is written
    alone: the job that ran is succeeded once, never rolled back to running."""
    first = enqueue(dsn, SLEEP0, "--priority", "10")
    poisoned = enqueue(dsn, SLEEP0)
    with connect(dsn) as conn:
        conn.execute(f"""
            CREATE FUNCTION refuse_start() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.job_id = '{poisoned}' AND NEW.status = 'running' THEN
                    RAISE EXCEPTION 'this one cannot start';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_start BEFORE UPDATE ON jobs
                FOR EACH ROW EXECUTE FUNCTION refuse_start();""")
    r = run_cli(dsn, "worker", "--max-jobs", "2", **FAST)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "this one cannot start" in r.stderr
    row = job(dsn, first)
    assert row["status"] == "succeeded" and row["attempt_count"] == 1
    assert job(dsn, poisoned)["status"] == "pending"
