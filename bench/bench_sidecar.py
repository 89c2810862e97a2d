"""What the command sidecar costs: a job's `command` started through the sidecar (as the
shipped worker pods do: a channel passed over the runner's one connection) against the same
command started by the worker itself, side by side in one run. Per command: start, wait for
its exit and read its output (`true`), from the worker's side, in an open job space. Per
job: a draining worker running one-action jobs (`command: true`) in the shipped
configuration (log settings of manifests/config.yaml), with and without
`JOBFENCE_COMMAND_SOCKET` (each job's space made, and removed, by the worker or by the
sidecar)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import JOBFENCE, REPO, Bench, Section, median, p95
from jobfence.actions.child import Child, ChildOutput, JobSpace
from jobfence.jobuids import SameUser
from jobfence.worker.jobspace import LocalSpace
from jobfence.worker.sidecar.link import SidecarLink, SidecarSpace


def runner(sock: Path, scratch: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A command runner that dials ``sock`` whenever a worker listens there."""
    scratch.mkdir()
    return subprocess.Popen([*JOBFENCE, "command-runner", "--socket", str(sock),
                             "--scratch", str(scratch)],
                            env={**env, "JOBFENCE_COMMAND_USER": "worker"}, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def per_command(space: JobSpace, n: int) -> list[float]:
    space.open()
    times = []
    for _ in range(n + 5):
        t0 = time.perf_counter()
        output = ChildOutput()
        child: Child = space.start(["true"], {"PATH": "/usr/bin:/bin"}, output.add)
        while child.wait(0.001) is None:
            pass
        child.close()
        output.result()
        times.append(time.perf_counter() - t0)
    space.close()
    return times[5:]  # the first few warm up the runner and the page cache


def per_job(bench: Bench, jobs: int, **extra: str) -> float:
    dsn = bench.database()
    env = bench.deployed_env(dsn) | extra
    spec = [{"actions": [{"name": "command", "params": {"argv": ["true"]}}]}] * jobs
    subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], input=json.dumps(spec), env=env,
                   cwd=REPO, capture_output=True, text=True, check=True)
    t0 = time.perf_counter()
    r = subprocess.run([*JOBFENCE, "worker", "--max-jobs", str(jobs)], env=env, cwd=REPO,
                       capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    report = json.loads(r.stdout)
    if report["succeeded"] != jobs:
        raise RuntimeError(f"the worker did not run every job: {r.stderr[-2000:]}")
    return jobs / elapsed


def run(bench: Bench) -> Section:
    n, jobs = (50, 100) if bench.quick else (300, 500)
    with tempfile.TemporaryDirectory() as tmp:
        shared = Path(tmp)
        sock = shared / "worker" / "command.sock"
        env = bench.env("dbname=unused")
        proc = runner(sock, shared / "scratch", env)
        try:
            local = per_command(LocalSpace(shared, uuid.uuid4(), SameUser()), n)
            link = SidecarLink(sock, connect_seconds=30)
            try:
                remote = per_command(SidecarSpace(link, uuid.uuid4()), n)
            finally:
                link.close()
            here = per_job(bench, jobs, JOBFENCE_COMMAND_USER="worker")
            there = per_job(bench, jobs, JOBFENCE_COMMAND_USER="worker",
                            JOBFENCE_COMMAND_SOCKET=str(sock))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    s = Section("The command sidecar's cost", "python -m bench.run --only sidecar",
                ["measure", "worker's own child", "through the sidecar", "sidecar / own"])
    s.rows.append([f"one `true`: start → exit → output (median of {n})",
                   f"{median(local) * 1000:.2f} ms", f"{median(remote) * 1000:.2f} ms",
                   f"{median(remote) / median(local):.2f}×"])
    s.rows.append(["same, p95", f"{p95(local) * 1000:.2f} ms",
                   f"{p95(remote) * 1000:.2f} ms", f"{p95(remote) / p95(local):.2f}×"])
    s.rows.append([f"draining worker, {jobs} jobs of `command: true`",
                   f"{here:.0f} jobs/s", f"{there:.0f} jobs/s", f"{there / here:.2f}×"])
    s.notes.append("The sidecar adds a socket pair passed over the runner's connection and "
                   "a JSON round trip per command, and per job the requests that make and "
                   "remove its space; the child's own start (fork, exec) is the same. A "
                   "job's database round trips are the same either way.")
    return s
