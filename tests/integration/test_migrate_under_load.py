"""`jobfence migrate` while workers claim and finish, on a real PostgreSQL: a rolling deploy
runs the migrate Job beside the running pools. Every function file is run again each time
(its recorded digest cleared first: the heaviest migrate there is, every fenced function
re-created in one transaction under the workers' calls), and the roles' grants given
again. No worker sees an error, no fence is lost, no job is run twice or left behind."""

from __future__ import annotations

import json
import subprocess
import threading
import time

from jobfence.db import Connection
from jobfence.store import Store
from jobfence.store.migrations import function_files
from tests.support import Dsn, run_cli
from tests.support.factories import new_job
from tests.support.procs import spawn

JOBS = 360
WORKERS = 3


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
