"""`make chaos-guards`: a worker's guards under fire (invariant 15), judged by the database.

One draining ``jobfence worker`` runs job after job whose commands give their processes
names that are not UTF-8 (``printf '\\377\\376' > /proc/$$/comm``: the command itself, and a
daemon it leaves behind in a session of its own, as a job may, or as an innocent executable
with a non-ASCII name cut mid-character by the kernel at 15 bytes), while the server ends
the worker's heartbeat connection over and over (``pg_terminate_backend``: a restart, a
failover, a pooler restart), each time once the one before it was replaced. Every so often
a job that would run for a minute is cancelled while it runs.

Judged at the end: every plain job succeeded in one attempt (renewed throughout: none
self-fenced or was reclaimed), every cancelled one is ``cancelled`` and its command was
killed within a few seconds, no daemon is left alive, the worker logged no crash and no
``guards_failed``, and ``kills`` connections were killed.

    python -m bench.guard_chaos                   # 1,000 hostile names, 1,000 killed connections
    python -m bench.guard_chaos --jobs 50 --kills 50   # the size the acceptance test runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.sqlconn import connect

JOBFENCE = [sys.executable, "-m", "jobfence.functions.cli"]
FAST = {"JOBFENCE_LEASE_SECONDS": "2", "JOBFENCE_HEARTBEAT_SECONDS": "0.3",
        "JOBFENCE_RETRY_BASE_SECONDS": "0", "JOBFENCE_LOG_FORMAT": "json"}

HOSTILE = r"""
setsid -f sh -c 'printf "\377\376" > /proc/$$/comm; echo $$ >> "$DAEMONS"; sleep 300; :' \
    </dev/null >/dev/null 2>&1
printf 'caf\303' > /proc/$$/comm
sleep "$SECONDS_TO_RUN"
"""
"""A job's command: a daemon named with bytes that are not UTF-8, in a session of its own;
then itself renamed to a name cut mid-character; then a short run. (The daemon lets go of
the command's output: one that holds it costs the job the worker's wait for its pipes.)"""

LONG = r"""
printf '\377' > /proc/$$/comm
echo $$ > "$PIDFILE"
sleep 60
"""
"""A job that is cancelled while it runs: its own name hostile too."""


@dataclass
class Outcome:
    jobs: int
    kills: int = 0
    succeeded: int = 0
    cancels: int = 0
    cancels_reached: int = 0
    slowest_cancel_seconds: float = 0.0
    slowest_commit_to_gone_seconds: float = 0.0
    """From the cancel's commit (its audit row's time) to the command seen gone: what
    invariant 12's second is about, without the ``jobfence cancel`` process's own start."""
    daemons: int = 0
    daemons_alive: int = 0
    worker_exit: int | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def table(self) -> str:
        rows = [("jobs with hostile process names, succeeded", f"{self.succeeded} / {self.jobs}"),
                ("heartbeat connections killed", str(self.kills)),
                ("cancels reaching their command", f"{self.cancels_reached} / {self.cancels}"),
                ("slowest cancel to command gone", f"{self.slowest_cancel_seconds:.2f} s"),
                ("slowest cancel's commit to command gone",
                 f"{self.slowest_commit_to_gone_seconds:.2f} s"),
                ("daemons left alive", f"{self.daemons_alive} / {self.daemons}"),
                ("worker exit code", str(self.worker_exit)),
                ("wall time", f"{self.seconds:.0f} s"),
                ("problems", "; ".join(self.problems) or "none")]
        return "\n".join(f"| {a} | {b} |" for a, b in [("check", "result"), ("---", "---"),
                                                          *rows])


def _enqueue(env: dict[str, str], specs: list[dict[str, Any]]) -> list[str]:
    r = subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(specs), env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"enqueue failed: {r.stderr[-2000:]}")
    out = r.stdout.strip()
    objs = json.loads(out) if out.startswith("[") else [json.loads(x) for x in out.splitlines()]
    return [str(o["job_id"]) for o in objs]


def _alive(pid: int, marker: bytes | None = None) -> bool:
    """Whether ``pid`` still runs (and, given ``marker``, is still the process that carried
    it in its environment: on a busy machine a pid comes round again within minutes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()  # its name is hostile: bytes
        if marker is not None and marker not in Path(f"/proc/{pid}/environ").read_bytes():
            return False
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def run(dsn: str, env_of: Callable[[str], dict[str, str]], work: Path, *, jobs: int,
        kills: int, cancel_every: int = 25, seconds: float = 0.15,
        concurrency: int = 2) -> Outcome:
    """Enqueue ``jobs`` hostile jobs (and a long one to cancel per ``cancel_every``), run
    one draining worker over them while killing its heartbeat connection ``kills`` times,
    and judge. ``env_of(command)`` is a jobfence process's environment for a command."""
    out = Outcome(jobs=jobs)
    daemons = work / "daemons"
    daemons.touch(mode=0o666)
    script = work / "hostile.sh"
    script.write_text(HOSTILE)
    long_script = work / "long.sh"
    long_script.write_text(LONG)
    # long enough a run that the kills (each waiting for a renewal) end before the jobs do
    seconds = max(seconds, kills * 0.45 * concurrency / max(jobs, 1))
    env = {"DAEMONS": str(daemons), "SECONDS_TO_RUN": f"{seconds:.2f}"}
    n_long = max(1, jobs // cancel_every)
    pidfiles = [work / f"long-{i}.pid" for i in range(n_long)]
    specs: list[dict[str, Any]] = []
    kinds: list[bool] = []  # True: a long job, to cancel
    for i in range(jobs):
        specs.append({"actions": [{"name": "command", "params": {
            "argv": ["sh", str(script)], "env": env}}], "max_attempts": 1})
        kinds.append(False)
        if i % cancel_every == cancel_every // 2 and kinds.count(True) < n_long:
            specs.append({"actions": [{"name": "command", "params": {
                "argv": ["sh", str(long_script)],
                "env": {"PIDFILE": str(pidfiles[kinds.count(True)])}}}], "max_attempts": 1})
            kinds.append(True)
    ids = _enqueue(env_of("enqueue"), specs)
    plain = [j for j, long in zip(ids, kinds, strict=True) if not long]
    longs = [j for j, long in zip(ids, kinds, strict=True) if long]
    pidfiles = pidfiles[:len(longs)]
    out.cancels = len(longs)
    began = time.monotonic()
    worker = subprocess.Popen(
        [*JOBFENCE, "worker", "--max-jobs", str(len(ids)), "--concurrency",
         str(concurrency)], env=env_of("worker"), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    done = threading.Event()
    stderr: list[str] = []
    drain = threading.Thread(target=lambda: stderr.append(worker.stderr.read()),  # type: ignore[union-attr]
                             daemon=True)
    drain.start()
    with connect(dsn) as conn:
        def killer() -> None:
            last: int | None = None
            while not done.is_set() and out.kills < kills:
                row = conn_k.execute(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE application_name = 'jobfence-heartbeat' "
                    "AND datname = current_database() AND pid IS DISTINCT FROM %s "
                    "ORDER BY backend_start DESC LIMIT 1", (last,)).fetchone()
                if row is None:
                    time.sleep(0.02)
                    continue
                killed = conn_k.execute("SELECT pg_terminate_backend(%s), clock_timestamp() "
                                        "AS at", (row["pid"],)).fetchone()
                last = row["pid"]
                out.kills += 1
                # the next kill once the worker has renewed through a new connection
                deadline = time.monotonic() + 3
                while not done.is_set() and time.monotonic() < deadline:
                    beat = conn_k.execute("SELECT max(heartbeat_at) AS b FROM jobs "
                                          "WHERE status = 'running'").fetchone()
                    if beat and killed and beat["b"] is not None and beat["b"] > killed["at"]:
                        break
                    time.sleep(0.02)

        with connect(dsn) as conn_k:
            kt = threading.Thread(target=killer, daemon=True)
            kt.start()
            for job_id, pidfile in zip(longs, pidfiles, strict=True):
                pid = _wait(lambda p=pidfile: int(p.read_text()) if p.exists()  # type: ignore[misc]
                            and p.read_text().strip() else 0, timeout=600)
                time.sleep(0.5)
                t0 = time.monotonic()
                r = subprocess.run([*JOBFENCE, "cancel", job_id], env=env_of("cancel"),
                                   capture_output=True, text=True, timeout=60, check=False)
                if r.returncode != 0:
                    out.problems.append(f"cancel {job_id}: exit {r.returncode} {r.stderr[-300:]}")
                if _wait(lambda p=pid: not _alive(p), timeout=10):  # type: ignore[misc]
                    out.cancels_reached += 1
                gone = time.time()
                out.slowest_cancel_seconds = max(out.slowest_cancel_seconds,
                                                 time.monotonic() - t0)
                committed = conn_k.execute(
                    "SELECT extract(epoch FROM at)::float8 AS at FROM job_events "
                    "WHERE job_id = %s AND to_status = 'cancelled'", (job_id,)).fetchone()
                if committed is not None:
                    out.slowest_commit_to_gone_seconds = max(
                        out.slowest_commit_to_gone_seconds, gone - committed["at"])
            # keep the worker busy (and its connection killed) until the kills are done
            while out.kills < kills and worker.poll() is None:
                time.sleep(0.1)
            kt.join(timeout=1)
        try:
            out.worker_exit = worker.wait(timeout=max(600, jobs * 2))
        except subprocess.TimeoutExpired:
            worker.kill()
            out.worker_exit = worker.wait()
            out.problems.append("the worker did not finish")
        done.set()
        drain.join(timeout=10)
        worker.stderr.close()  # type: ignore[union-attr]
        out.seconds = time.monotonic() - began
        rows = conn.execute("SELECT job_id::text AS id, status, attempt_count FROM jobs "
                            "WHERE job_id::text = ANY(%s)", (plain + longs,)).fetchall()
    by_id = {r["id"]: r for r in rows}
    out.succeeded = sum(1 for j in plain if by_id[j]["status"] == "succeeded"
                        and by_id[j]["attempt_count"] == 1)
    if out.succeeded != jobs:
        bad = [(j, by_id[j]["status"]) for j in plain if by_id[j]["status"] != "succeeded"]
        out.problems.append(f"{jobs - out.succeeded} plain jobs did not succeed once: {bad[:5]}")
    not_cancelled = [j for j in longs if by_id[j]["status"] != "cancelled"]
    if not_cancelled:
        out.problems.append(f"not cancelled: {not_cancelled}")
    if out.cancels_reached != out.cancels:
        out.problems.append("a cancel did not reach its command within 10 s")
    pids = [int(x) for x in daemons.read_text().split()]
    out.daemons = len(pids)
    marker = f"DAEMONS={daemons}".encode()
    out.daemons_alive = sum(1 for p in pids if _alive(p, marker))
    if out.daemons < jobs:
        out.problems.append(f"only {out.daemons} daemons started")
    if out.daemons_alive:
        out.problems.append(f"{out.daemons_alive} daemons escaped")
    if out.kills < kills:
        out.problems.append(f"only {out.kills} connections killed")
    log = "".join(stderr)
    for bad_line in ("Traceback", "Exception in thread", "guards_failed", "self_fenced"):
        if bad_line in log:
            out.problems.append(f"the worker logged {bad_line!r}")
    # the cancelled jobs make the exit 1 (a lost fence); anything else is a crash
    if out.worker_exit != 1:
        out.problems.append(f"worker exit {out.worker_exit}, expected 1 (its cancelled jobs)")
    return out


def _wait(fn: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(ValueError, OSError):
            value = fn()
            if value:
                return value
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def main() -> int:
    from devtools.embedded_pg import EmbeddedPostgres
    from jobfence.store.migrations import migrate

    p = argparse.ArgumentParser(prog="python -m bench.guard_chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--kills", type=int, default=1000)
    p.add_argument("--lease", type=float, default=10.0,
                   help="JOBFENCE_LEASE_SECONDS (heartbeat 0.3 s whatever it is): a lease "
                        "short against the machine's load self-fences a job, as it must")
    args = p.parse_args()
    with EmbeddedPostgres() as pg, tempfile.TemporaryDirectory() as tmp:
        with connect(pg.dsn) as conn:
            migrate(conn)
        base = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
        base.pop("PYTHONPATH", None)
        base.update({"JOBFENCE_DATABASE_URL": pg.dsn, "JOBFENCE_COMMAND_USER": "worker",
                     **FAST, "JOBFENCE_LEASE_SECONDS": str(args.lease)})
        work = Path(tmp)
        work.chmod(0o755)
        out = run(pg.dsn, lambda _command: base, work, jobs=args.jobs, kills=args.kills)
    print(out.table())
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
