"""A job's code looks for the keys, as a hostile job would, and finds none (invariant 9).

The job's command searches everything its process can read — its environment, its
parent's, every ``/proc/*/environ`` and ``cmdline`` it can open, every file under the
worker's working directory and home (where a deployment left a credentials file that only
the worker may read) — then tries, with every connection string it found, to mark another
running job succeeded, read its fence, claim a job, update and delete tables, enqueue and
drop a table. Nothing is found, nothing is tried, every other job is as it was, and its own
job ends as its worker decides.

The search is aimed at the test's own server only: a connection string to any other server
(another test's, a chaos run's, on the same machine) is counted but never used — an attack
that works is an attack, and it must not land on a neighbour. (It once did: run as root,
this search read a concurrent chaos run's superuser URL from its processes' environments and
dropped that run's audit table.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobfence.store import Store
from tests.support import JOBFENCE, Dsn, cli_env
from tests.support.factories import enqueue_one
from tests.support.hostile import SEARCH, servers
from tests.support.procs import FAST, events, job


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may enter (pytest's own temporary root is closed to others)."""
    path = Path(tempfile.mkdtemp(prefix="jobfence-keys-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_jobs_command_finds_no_key_and_changes_nothing(dsn: Dsn, store: Store,
                                                        open_dir: Path) -> None:
    # Another worker's job, running, with its audit trail so far.
    other = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="another-worker", lease_seconds=300)
    assert claim.job_id == other
    before = (job(dsn, str(other)), events(dsn, str(other)))
    # The worker's home and working directory, as a deployment may leave them: a
    # credentials file only the worker's user may read.
    home = open_dir / "worker-home"
    home.mkdir()
    secret = home / ".pgpass"
    env = cli_env(dsn, "worker", **FAST, JOBFENCE_COMMAND_USER="nobody")
    secret.write_text(env["JOBFENCE_DATABASE_URL"] + "\n")
    secret.chmod(0o600)
    (home / "notes.txt").write_text("nothing to see\n")  # readable: the search does read
    drop = open_dir / "drop"
    drop.mkdir()
    drop.chmod(0o777)  # where the job leaves its report for the test
    report = drop / "report.json"
    # The system's Python: the test's own may live where only root may enter. (psycopg is
    # imported only when a connection string was found.)
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
    hostile = enqueue_one(store, actions=[{"name": "command", "params": {"argv": [
        python, "-c", SEARCH, str(report), str(home), str(home), servers(dsn)]}}])
    r = subprocess.run([*JOBFENCE, "worker"], env={**env, "HOME": str(home)}, cwd=home,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "command_env_unsafe" not in r.stderr  # nothing handed over, nothing to warn of
    found = json.loads(report.read_text())
    assert found["uid"] != os.getuid()  # the command ran as another user
    assert found["found"] == [] and found["tried"] == [], found
    assert found["files"] >= 1  # it did search
    assert not any(k.startswith(("JOBFENCE_DATABASE", "AWS_", "PG")) for k in found["env"])
    # Every other job is as it was; the hostile job ended as its worker decided.
    assert (job(dsn, str(other)), events(dsn, str(other))) == before
    assert job(dsn, str(hostile))["status"] == "succeeded"
    assert [e["to_status"] for e in events(dsn, str(hostile))] == [
        "pending", "running", "succeeded"]


def test_the_worker_role_bounds_a_command_that_is_handed_the_keys(
        dsn: Dsn, store: Store, tmp_path: Path) -> None:
    """Where a deployment passes the worker's URL to its jobs anyway (JOBFENCE_COMMAND_ENV),
    the worker's role is all it gets: no table, no other job's fence, nothing dropped."""
    other = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="another-worker", lease_seconds=300)
    before = (job(dsn, str(other)), events(dsn, str(other)))
    drop = tmp_path / "drop"
    drop.mkdir()
    report = drop / "report.json"
    enqueue_one(store, actions=[{"name": "command", "params": {"argv": [
        sys.executable, "-c", SEARCH, str(report), str(drop), str(drop), servers(dsn)]}}])
    env = cli_env(dsn, "worker", **FAST, JOBFENCE_COMMAND_ENV="JOBFENCE_DATABASE_URL",
                  JOBFENCE_COMMAND_ENV_ALLOW_SECRETS="true")  # refused without it
    # A neighbour on the same machine whose superuser URL the search (run as root) can read:
    # found, never tried (nothing listens there; a try would be reported as "connect").
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={
            **os.environ, "NEIGHBOUR_URL": "postgresql://postgres@127.0.0.1:9/postgres"}) as n:
        try:
            r = subprocess.run([*JOBFENCE, "worker"], env=env, capture_output=True, text=True,
                               timeout=120, check=False)
        finally:
            n.kill()
    assert r.returncode == 0, r.stderr
    assert "command_env_unsafe" in r.stderr  # said loudly
    found = json.loads(report.read_text())
    assert "127.0.0.1:9" in found["elsewhere"], found
    assert found["found"], found  # handed the worker's URL...
    outcomes = {what: {o for w, o in found["tried"] if w == what} for what, _ in found["tried"]}
    assert outcomes.pop("claim a job") == {"done"}  # ...it may claim (nothing is ready)
    assert outcomes and all(o == {"InsufficientPrivilege"} for o in outcomes.values()), found
    assert (job(dsn, str(other)), events(dsn, str(other))) == before
    assert claim.job_id == other
