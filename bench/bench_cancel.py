"""Cancel → the running command gone, at the shipped lease (120 s) and heartbeat (30 s):
directly (the worker LISTENs and is told at once) and through PgBouncer in transaction mode
(no LISTEN: the worker asks every `JOBFENCE_STOP_CHECK_SECONDS`, 0.5 s). Measured from the
operator's cancel (committed, in this process) to the moment the command's process is gone
(polled every millisecond in /proc). Beside it, how long the cancelled job then stayed
"stopping" (until the worker confirmed the command gone, the moment `retry` may run it
again), and one run as the previous release did it: the worker learning of the cancel only
at its next heartbeat (stop checks every 60 s, no LISTEN)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import JOBFENCE, REPO, Bench, Section, median, p95
from devtools.pgbouncer import PgBouncer
from devtools.sqlconn import connect
from jobfence.db import connect as jf_connect
from jobfence.store import Store

TARGET_SECONDS = 1.0


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except OSError:  # gone between the open and the read, or before
        return True


def one(bench: Bench, route: str, pooler: str, direct: str, tmp: Path,
        **env: str) -> tuple[float, float]:
    """(cancel → command gone, cancel → stop confirmed), in seconds."""
    pid_file = tmp / "pid"
    pid_file.unlink(missing_ok=True)
    spec = {"actions": [{"name": "command", "params": {
        "argv": ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"]}}]}
    environ = bench.deployed_env(route) | {"JOBFENCE_DATABASE_POOLER": pooler,
                                           "JOBFENCE_COMMAND_USER": "worker", **env}
    r = subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(spec),
                       env=environ, cwd=REPO, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"enqueue failed ({r.returncode}): {r.stderr[-2000:]}")
    job_id = json.loads(r.stdout)["job_id"]
    worker = subprocess.Popen([*JOBFENCE, "worker"], env=environ, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    operator = Store(jf_connect(route, pooler=pooler))
    look = connect(direct)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise RuntimeError("the worker never started its command")
            time.sleep(0.005)
        pid = int(pid_file.read_text())
        time.sleep(1.0)  # past the first stop check: a cancel in the middle of a run
        t0 = time.perf_counter()
        operator.jobs.cancel(job_id=job_id, reason="bench")
        while not gone(pid):
            if time.perf_counter() - t0 > 120:
                raise RuntimeError("the command outlived its cancel by two minutes")
            time.sleep(0.001)
        killed = time.perf_counter() - t0
        while True:
            row = look.execute("SELECT stopping_attempt_id FROM jobs WHERE job_id = %s",
                               (job_id,)).fetchone()
            if row is None or row["stopping_attempt_id"] is None:
                confirmed = time.perf_counter() - t0
                break
            time.sleep(0.002)
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        operator.conn.close()
        look.close()
    return killed, confirmed


def run(bench: Bench) -> Section:
    n = 5 if bench.quick else 20
    s = Section("Cancel to the command gone", "python -m bench.run --only cancel",
                ["route", f"cancel → command gone, median of {n}", "p95", "vs target 1 s",
                 "cancel → stop confirmed (retry may run it), p95"])
    with PgBouncer(bench.pg.dsn, pool_mode="transaction", default_pool_size=8) as bouncer, \
            tempfile.TemporaryDirectory() as tmp:
        for name, pooler in (("directly (told: LISTEN/NOTIFY)", "none"),
                             ("through PgBouncer, transaction mode (asks every 0.5 s)",
                              "transaction")):
            direct = bench.database()
            dbname = direct.rsplit("/", 1)[1]
            route = direct if pooler == "none" else bouncer.url(dbname)
            runs = [one(bench, route, pooler, direct, Path(tmp)) for _ in range(n)]
            killed = [k for k, _ in runs]
            confirmed = [c for _, c in runs]
            s.rows.append([name, f"{median(killed) * 1000:.0f} ms",
                           f"{p95(killed) * 1000:.0f} ms",
                           f"{p95(killed) / TARGET_SECONDS:.2f}×",
                           f"{p95(confirmed) * 1000:.0f} ms"])
        if not bench.quick:
            direct = bench.database()
            route = bouncer.url(direct.rsplit("/", 1)[1])
            killed, confirmed = one(bench, route, "transaction", direct, Path(tmp),
                                    JOBFENCE_STOP_CHECK_SECONDS="60")
            s.rows.append(["as before: only the heartbeat (every 30 s) finds the fence gone",
                           f"{killed * 1000:.0f} ms (one run)", "—",
                           f"{killed / TARGET_SECONDS:.1f}×", f"{confirmed * 1000:.0f} ms"])
    s.notes.append("A `jobfence worker` at the shipped settings (lease 120 s, heartbeat 30 s, "
                   "the manifests' log settings) runs `sleep 300`; one second in, an operator "
                   "cancels the job. Until the worker confirms its command gone, the job keeps "
                   "its resource and `retry` answers 3 (\"still stopping\"). "
                   "tests/acceptance/test_cancel.py cancels and retries at once 50 times (20 "
                   "through PgBouncer) and finds no two runs ever overlapping.")
    return s
