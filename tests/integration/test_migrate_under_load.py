"""`jobfence migrate` while workers claim and finish, on a real PostgreSQL: a rolling deploy
runs the migrate Job beside the running pools. Every function file is run again each time
(its recorded digest cleared first: the heaviest migrate there is, every fenced function
re-created in one transaction under the workers' calls), and the roles' grants given
again. No worker sees an error, no fence is lost, no job is run twice or left behind — nor
when the workers are the previous release's, meeting the new release's migrate."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from devtools.sqlconn import connect
from jobfence.db import Connection
from jobfence.store import Store
from jobfence.store.migrations import available, function_files
from tests.support import REPO, Dsn, cli_env, run_cli
from tests.support.factories import new_job
from tests.support.pg import Databases
from tests.support.procs import FAST, spawn, wait_for

JOBS = 360
WORKERS = 3
OLD_JOBS = 24


def test_migrate_under_load_loses_no_fence_and_no_job(
        dsn: Dsn, conn: Connection, store: Store) -> None:
    made = store.jobs.enqueue([new_job(actions=[{"name": "sleep", "params": {"seconds": 0.1}}],
                                       max_attempts=1) for _ in range(JOBS)])
    stop = threading.Event()
    runs: list[tuple[float, float, subprocess.CompletedProcess[str]]] = []

    def migrate_again_and_again() -> None:
        while not stop.is_set():
            conn.execute("DELETE FROM jobfence_function_files")  # every file runs again
            started = time.monotonic()
            r = run_cli(dsn, "migrate", timeout=120)
            runs.append((started, time.monotonic(), r))

    workers = [spawn(dsn, "worker", "--max-jobs", str(JOBS), "--concurrency", "4",
                     "--idle-seconds", "3") for _ in range(WORKERS)]
    began = time.monotonic()
    migrating = threading.Thread(target=migrate_again_and_again)
    migrating.start()
    try:
        outs = [w.communicate(timeout=240) for w in workers]
    finally:
        stop.set()
        migrating.join(180)
        for w in workers:
            w.kill()
    ended = time.monotonic()

    everything = sorted(f.name for f in function_files())
    for _, _, r in runs:
        assert r.returncode == 0, r.stderr
        assert sorted(json.loads(r.stdout)["functions"]) == everything
    within = [r for s, e, r in runs if s >= began and e <= ended]
    assert len(within) >= 2, f"only {len(within)} migrations ran while the workers worked"
    reports = [json.loads(out) for out, _ in outs]
    for w, (out, err) in zip(workers, outs, strict=True):
        assert w.returncode == 0, err[-3000:]
    assert sum(r["succeeded"] for r in reports) == JOBS, reports
    assert sum(r["claimed"] for r in reports) == JOBS, reports
    rows = conn.execute("SELECT status, attempt_count, count(*) AS n FROM jobs "
                        "GROUP BY 1, 2").fetchall()
    assert rows == [{"status": "succeeded", "attempt_count": 1, "n": JOBS}]
    trails = conn.execute("""
        SELECT job_id, array_agg(to_status ORDER BY event_id) AS trail FROM job_events
        WHERE job_id = ANY(%s) GROUP BY job_id""", ([m.job_id for m in made],)).fetchall()
    assert len(trails) == JOBS
    assert {tuple(t["trail"]) for t in trails} == {("pending", "running", "succeeded")}



def previous_release(into: Path) -> tuple[list[str], str]:
    """The command line of the code as it was just before the newest migration was added
    (read from this repository's history), and the ``PYTHONPATH`` it needs: a pod of the
    release before, still running while a rolling deploy's migrate Job moves the schema on."""
    newest = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%H",
                             "--diff-filter=A", "--", "shared/store/schema/"],
                            capture_output=True, text=True, check=False)
    assert newest.returncode == 0 and newest.stdout.strip(), (
        "the previous release is read from this repository's history (a full clone): "
        + newest.stderr)
    tree = into / "previous"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", f"{newest.stdout.strip()}^",
                              "shared", "functions"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    # The package's layout as installed: jobfence is shared/, jobfence.functions functions/.
    (into / "site").mkdir()
    (into / "site" / "jobfence").symlink_to(tree / "shared")
    (tree / "shared" / "functions").symlink_to(tree / "functions")
    return ([sys.executable, "-c",
             "import sys; from jobfence.functions.cli import main; sys.exit(main())"],
            str(into / "site"))


def test_a_worker_of_the_previous_release_finishes_its_jobs_across_migrate(
        databases: Databases, tmp_path: Path) -> None:
    """A rolling deploy: the previous release's workers are running jobs when the new
    release's migrate Job moves the schema on (its migrations, then every function file
    whose text changed, re-created under their calls). They go on claiming, renewing and
    finishing through the new functions (the compatibility the migrations promise), the new
    release's worker works beside them, and nothing is lost or run twice."""
    python, site = previous_release(tmp_path)
    url = Dsn(databases.create(migrated=False))
    url.direct = url
    procs: list[subprocess.Popen[str]] = []

    def previous(*args: str, **env: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([*python, *args], cwd=tmp_path, text=True,
                             env={**cli_env(url, args[0], **{**FAST, **env}),
                                  "PYTHONPATH": site}, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(p)
        return p

    def finished(p: subprocess.Popen[str], stdin: str | None = None) -> str:
        out, err = p.communicate(stdin, timeout=180)
        assert p.returncode == 0, err[-3000:]
        return out

    try:
        assert json.loads(finished(previous("migrate")))["applied"]
        with connect(url) as conn:
            head = conn.execute("SELECT max(version) AS v FROM "
                                "jobfence_schema_migrations").fetchone()
        assert head is not None and head["v"] < max(m.version for m in available())
        spec = json.dumps([{"actions": [{"name": "sleep", "params": {"seconds": 1}}],
                            "max_attempts": 1}] * OLD_JOBS)
        made = finished(previous("enqueue", "--spec", "-"), spec).splitlines()
        assert len(made) == OLD_JOBS
        workers = [previous("worker", "--max-jobs", str(OLD_JOBS), "--concurrency", "2",
                            "--idle-seconds", "4", JOBFENCE_WORKER_ID=f"previous-{i}")
                   for i in range(2)]
        with connect(url) as conn:
            wait_for(lambda: conn.execute("SELECT count(*) AS n FROM jobs WHERE status = "
                                          "'running'").fetchone() == {"n": 4}, timeout=60)
        r = run_cli(url, "migrate", timeout=120)
        assert r.returncode == 0, r.stderr
        applied = json.loads(r.stdout)
        # Every function file whose text the new release changed is made again under the
        # previous release's calls (the ones it never had made for the first time).
        changed = sorted(f.name for f in (REPO / "shared" / "store").glob("*.functions.sql")
                         if not (tmp_path / "previous" / "shared" / "store" / f.name).exists()
                         or (tmp_path / "previous" / "shared" / "store" / f.name).read_text()
                         != f.read_text())
        assert applied["applied"] and changed and sorted(applied["functions"]) == changed, (
            applied, changed)
        with connect(url) as conn:
            migrated_at = conn.execute("SELECT clock_timestamp() AS t").fetchone()
        assert migrated_at is not None
        current = spawn(url, "worker", "--max-jobs", str(OLD_JOBS), "--concurrency", "2",
                        "--idle-seconds", "3", JOBFENCE_WORKER_ID="current")
        procs.append(current)
        reports = [json.loads(finished(w)) for w in [*workers, current]]
        assert sum(r["succeeded"] for r in reports) == OLD_JOBS, reports
        with connect(url) as conn:
            rows = conn.execute("SELECT status, attempt_count, count(*) AS n FROM jobs "
                                "GROUP BY 1, 2").fetchall()
            after = conn.execute("SELECT claimed_by, count(*) AS n FROM jobs WHERE "
                                 "claimed_at > %s GROUP BY 1", (migrated_at["t"],)).fetchall()
            trails = conn.execute("SELECT array_agg(to_status ORDER BY event_id) AS trail "
                                  "FROM job_events GROUP BY job_id").fetchall()
        assert rows == [{"status": "succeeded", "attempt_count": 1, "n": OLD_JOBS}], rows
        claims = {a["claimed_by"]: a["n"] for a in after}
        assert sum(n for w, n in claims.items() if w.startswith("previous-")) >= 2, claims
        assert len(trails) == OLD_JOBS
        assert {tuple(t["trail"]) for t in trails} == {("pending", "running", "succeeded")}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        databases.drop(url)
