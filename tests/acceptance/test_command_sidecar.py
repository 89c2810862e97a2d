"""The command sidecar, as the shipped worker pod runs it (``jobfence.worker.sidecar.protocol``).

The runner runs as a container of its own would (``tests.support.procs.Sidecar``): in a PID
namespace of its own under a small init, with an environment that holds no key, dialing the
socket a real worker listens on in a directory only the worker may write. As root its
children get a uid of their own per job; as a non-root uid (the restricted pod) its
children share that uid. Each test drives a real worker against it: results come back, a
snooze's file is read through the runner, a failure, a cancel, a timeout and a worker
killed outright leave nothing running, and a child of the runner's own uid can neither
stand in for the runner nor deny later jobs. The link's own rules and the protocol are unit
tests (tests/unit/test_sidecar_protocol.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobfence.store import Store
from tests.support import JOBFENCE, REPO, Dsn, cli_env, run_cli
from tests.support.factories import enqueue_one
from tests.support.hostile import SEARCH, servers
from tests.support.procs import (
    FAST,
    SYSTEM_PYTHON,
    Sidecar,
    action_results,
    enqueue,
    events,
    job,
    kill_quietly,
    wait_for,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="a PID namespace of its own needs root and unshare")

RUNNER_UID = 10002
"""The restricted pod's runner (and so its children): not the worker's uid."""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """Where the pod's volumes would be: the worker's socket directory and the runner's
    scratch (pytest's own temporary root is closed to other users)."""
    path = Path(tempfile.mkdtemp(prefix="jobfence-sidecar-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sidecar(shared_dir: Path) -> Iterator[Sidecar]:
    runner = Sidecar(shared_dir)
    yield runner
    kill_quietly(runner.proc)


@pytest.fixture
def pod_sidecar(shared_dir: Path) -> Iterator[Sidecar]:
    """The runner of the restricted pod: a uid of its own, which its children share."""
    runner = Sidecar(shared_dir, uid=RUNNER_UID)
    yield runner
    kill_quietly(runner.proc)


def worker_env(dsn: str, sidecar: Sidecar, **extra: str) -> dict[str, str]:
    return cli_env(dsn, "worker", **FAST, **sidecar.worker_env(), **extra)


def processes_with(marker: str) -> list[int]:
    """Host PIDs of live processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if marker.encode() in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


def test_a_command_in_the_sidecar_finds_no_key_and_its_results_come_back(
        dsn: Dsn, store: Store, sidecar: Sidecar) -> None:
    other = enqueue_one(store)
    [claim] = store.attempts.claim(worker_id="another-worker", lease_seconds=300)
    before = (job(dsn, str(other)), events(dsn, str(other)))
    drop = sidecar.socket.parent.parent / "drop"
    drop.mkdir()
    drop.chmod(0o777)
    report = drop / "report.json"
    home = sidecar.socket.parent.parent / "home"
    home.mkdir()
    env = worker_env(dsn, sidecar)
    (home / ".pgpass").write_text(env["JOBFENCE_DATABASE_URL"] + "\n")
    (home / ".pgpass").chmod(0o600)
    hostile = enqueue_one(store, actions=[
        {"name": "command", "params": {"argv": [SYSTEM_PYTHON, "-c", SEARCH, str(report),
                                                str(home), str(home), servers(dsn)]}},
        {"name": "command", "params": {"argv": [
            "sh", "-c", "echo out-line; echo err-line >&2; cat /proc/[0-9]*/cmdline | "
                        "tr '\\0' ' '"]}}])
    r = subprocess.run([*JOBFENCE, "worker"], env={**env, "HOME": str(home)}, cwd=home,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    found = json.loads(report.read_text())
    assert found["uid"] != 0 and found["found"] == [] and found["tried"] == [], found
    assert not any(k.startswith(("JOBFENCE_DATABASE", "AWS_", "PG")) for k in found["env"])
    # Its own PID namespace: the init, the runner, the shell and cat (the worker is not there).
    [_, second] = action_results(dsn, str(hostile))
    assert second["result"]["exit_code"] == 0
    lines = second["result"]["stdout_tail"].splitlines()
    assert lines[0] == "out-line" and "command-runner" in lines[1]
    assert " worker" not in lines[1], lines[1]
    assert second["result"]["stderr_tail"] == "err-line\n"
    assert job(dsn, str(hostile))["status"] == "succeeded"
    assert (job(dsn, str(other)), events(dsn, str(other))) == before
    assert claim.job_id == other


def test_a_failing_command_in_the_sidecar_fails_its_job_with_its_stderr(
        dsn: Dsn, store: Store, sidecar: Sidecar) -> None:
    failing = enqueue_one(store, max_attempts=1, actions=[{"name": "command", "params": {
        "argv": ["sh", "-c", "echo something broke >&2; exit 3"]}}])
    missing = enqueue_one(store, max_attempts=1, actions=[{"name": "command", "params": {
        "argv": ["/no/such/program"]}}])
    r = subprocess.run([*JOBFENCE, "worker", "--max-jobs", "2"],
                       env=worker_env(dsn, sidecar), capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 1, r.stderr
    assert job(dsn, str(failing))["status"] == "failed"
    assert job(dsn, str(failing))["error"] == "command exited with 3: something broke"
    assert job(dsn, str(missing))["error"].startswith("cannot start '/no/such/program'")


def test_cancel_and_timeout_kill_the_childs_whole_tree_in_the_sidecar(
        dsn: Dsn, store: Store, sidecar: Sidecar) -> None:
    # A child that leaves a daemon of its own session behind, then waits.
    marker = f"36{os.getpid() % 1000:03d}"
    tree = ["sh", "-c", f"setsid sleep {marker}1 & exec sleep {marker}2"]
    cancelled = enqueue_one(store, actions=[{"name": "command", "params": {"argv": tree}}])
    w = subprocess.Popen([*JOBFENCE, "worker"], env=worker_env(dsn, sidecar),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(processes_with(f"sleep {marker}")) == 2)
        r = run_cli(dsn, "cancel", str(cancelled))
        assert r.returncode == 0, r.stderr
        w.communicate(timeout=30)
        wait_for(lambda: not processes_with(f"sleep {marker}"), timeout=10)
    finally:
        kill_quietly(w)
    assert job(dsn, str(cancelled))["status"] == "cancelled"

    timed = enqueue_one(store, max_attempts=1, actions=[{"name": "command", "params": {
        "argv": tree, "timeout": "PT1S"}}])
    r = subprocess.run([*JOBFENCE, "worker"], env=worker_env(dsn, sidecar),
                       capture_output=True, text=True, timeout=60, check=False)
    assert job(dsn, str(timed))["error"] == "command timed out after 0:00:01"
    wait_for(lambda: not processes_with(f"sleep {marker}"), timeout=10)


def test_a_worker_killed_outright_takes_its_child_in_the_sidecar_with_it(
        dsn: Dsn, store: Store, sidecar: Sidecar) -> None:
    marker = f"37{os.getpid() % 1000:03d}"
    killed = enqueue_one(store, actions=[{"name": "command", "params": {"argv": [
        "sh", "-c", f"setsid sleep {marker}1 & exec sleep {marker}2"]}}])
    w = subprocess.Popen([*JOBFENCE, "worker"], env=worker_env(dsn, sidecar),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(processes_with(f"sleep {marker}")) == 2)
        w.send_signal(signal.SIGKILL)
        w.wait(timeout=10)
        wait_for(lambda: not processes_with(f"sleep {marker}"), timeout=10)
    finally:
        kill_quietly(w)
    # The runner dials the next worker, and stops on SIGTERM (exit 0, one JSON line).
    ok = enqueue_one(store, actions=[{"name": "command", "params": {"argv": ["true"]}}])
    assert run_cli(dsn, "cancel", str(killed)).returncode == 0
    r = subprocess.run([*JOBFENCE, "worker"], env=worker_env(dsn, sidecar),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and job(dsn, str(ok))["status"] == "succeeded", r.stderr
    code, out, err = sidecar.stop()
    assert code == 0, err
    assert json.loads(out) == {"function": "command-runner", "served": 2}
    assert not list(sidecar.scratch.iterdir())  # every job's space is gone


# -- a child of the runner's own uid (the restricted pod) ------------------------------------

PROBE = r'''
import json, os, socket, sys
path, report = sys.argv[1], sys.argv[2]
tried = {}
def attempt(name, fn):
    try:
        fn()
        tried[name] = "done"
    except OSError as exc:
        tried[name] = type(exc).__name__
attempt("connect", lambda: socket.socket(socket.AF_UNIX).connect(path))
attempt("rename", lambda: os.rename(path, path + ".moved"))
attempt("replace directory", lambda: os.rename(os.path.dirname(path),
                                               os.path.dirname(path) + ".moved"))
def plant():
    os.unlink(path)
    socket.socket(socket.AF_UNIX).bind(path)
attempt("plant a listener", plant)
attempt("new file beside it", lambda: open(os.path.join(os.path.dirname(path), "x"), "w"))
with open(report, "w") as f:
    json.dump({"uid": os.getuid(), "tried": tried}, f)
'''


def test_a_child_sharing_the_runners_uid_cannot_reach_the_socket_or_delay_later_jobs(
        dsn: Dsn, store: Store, pod_sidecar: Sidecar, shared_dir: Path) -> None:
    """The issue's item 8: in the pod a job's child has its runner's uid. Before, it could
    rename the runner's socket and every later job of a draining worker waited 10 s and
    failed an attempt. Now the socket is the worker's, gone once the runner dialed in, in a
    directory the runner's uid cannot write."""
    drop = shared_dir / "drop"
    drop.mkdir(mode=0o777)
    drop.chmod(0o777)
    report = drop / "probe.json"
    probe = enqueue_one(store, actions=[{"name": "command", "params": {"argv": [
        SYSTEM_PYTHON, "-c", PROBE, str(pod_sidecar.socket), str(report)]}}])
    later = [enqueue_one(store, actions=[{"name": "command", "params": {"argv": ["true"]}}])
             for _ in range(3)]
    started = time.monotonic()
    r = subprocess.run([*JOBFENCE, "worker", "--max-jobs", "4"],
                       env=worker_env(dsn, pod_sidecar), capture_output=True, text=True,
                       timeout=60, check=False)
    elapsed = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    found = json.loads(report.read_text())
    assert found["uid"] == RUNNER_UID
    assert found["tried"] == {"connect": "FileNotFoundError",
                              "rename": "FileNotFoundError",
                              "replace directory": "PermissionError",
                              "plant a listener": "FileNotFoundError",
                              "new file beside it": "PermissionError"}, found
    for job_id in (probe, *later):
        row = job(dsn, str(job_id))
        assert (row["status"], row["attempt_count"]) == ("succeeded", 1), row
    assert elapsed < 10, elapsed
    assert not os.path.exists(pod_sidecar.socket)


def test_a_child_that_kills_its_runner_fails_its_own_job_and_no_later_one(
        dsn: Dsn, store: Store, pod_sidecar: Sidecar) -> None:
    """A child may signal its runner (same uid). The runner's container then ends, and with
    it every child; the worker fails the job in hand, claims nothing more, and exits: a
    later job waits for another pod, not 10 s here, and no other job's attempt is spent."""
    marker = f"sleep 38{os.getpid() % 1000:03d}"
    killer = enqueue_one(store, max_attempts=1, actions=[{"name": "command", "params": {
        "argv": ["sh", "-c", f"kill -KILL $PPID; {marker}"]}}])
    later = enqueue_one(store, actions=[{"name": "command", "params": {"argv": ["true"]}}])
    started = time.monotonic()
    r = subprocess.run([*JOBFENCE, "worker", "--max-jobs", "2"],
                       env=worker_env(dsn, pod_sidecar), capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - started < 10
    report = json.loads(r.stdout)
    assert report["stopped_by"] == "sidecar_lost" and report["claimed"] == 1, report
    assert job(dsn, str(killer))["status"] == "failed"
    assert "command sidecar" in job(dsn, str(killer))["error"]
    row = job(dsn, str(later))
    assert (row["status"], row["attempt_count"]) == ("pending", 0)
    pod_sidecar.proc.wait(timeout=10)  # the namespace ended with its runner...
    assert not processes_with(marker)  # ...and took the child with it


def test_a_child_that_stops_its_runner_is_cancelled_and_the_worker_takes_no_more_jobs(
        dsn: Dsn, store: Store, pod_sidecar: Sidecar) -> None:
    """A stopped runner answers nothing: the kill of a cancelled child is never confirmed.
    The worker then treats the sidecar as lost instead of waiting on it with later jobs."""
    marker = f"sleep 39{os.getpid() % 1000:03d}"
    stopper = enqueue_one(store, actions=[{"name": "command", "params": {
        "argv": ["sh", "-c", f"sleep 1; kill -STOP $PPID; exec {marker}"]}}])
    later = enqueue_one(store, actions=[{"name": "command", "params": {"argv": ["true"]}}])
    w = subprocess.Popen([*JOBFENCE, "worker", "--max-jobs", "2"],
                         env=worker_env(dsn, pod_sidecar), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: processes_with(marker))
        runner = pod_sidecar.runner_pid()
        assert runner is not None
        wait_for(lambda: Path(f"/proc/{runner}/stat").read_text().rsplit(")", 1)[1].split()[0]
                 == "T")
        assert run_cli(dsn, "cancel", str(stopper)).returncode == 0
        out, err = w.communicate(timeout=30)
    finally:
        kill_quietly(w)
    assert w.returncode == 1, err
    assert json.loads(out)["stopped_by"] == "sidecar_lost"
    assert job(dsn, str(stopper))["status"] == "cancelled"
    row = job(dsn, str(later))
    assert (row["status"], row["attempt_count"]) == ("pending", 0)
    kill_quietly(pod_sidecar.proc)  # the pod ends: its namespace and the child with it
    wait_for(lambda: not processes_with(marker), timeout=10)


@pytest.mark.parametrize("runner", ["sidecar", "pod_sidecar"])
def test_a_command_in_the_sidecar_snoozes_through_its_snooze_file(
        dsn: Dsn, store: Store, runner: str, request: pytest.FixtureRequest) -> None:
    sidecar: Sidecar = request.getfixturevalue(runner)
    snoozing = enqueue_one(store, max_attempts=1, actions=[{"name": "command", "params": {
        "argv": ["sh", "-c", 'echo PT10M > "$JOBFENCE_SNOOZE_FILE"; exit 75']}}])
    linked = enqueue_one(store, max_attempts=1, actions=[{"name": "command", "params": {
        "argv": ["sh", "-c", 'ln -s /etc/hostname "$JOBFENCE_SNOOZE_FILE"; exit 75']}}])
    r = subprocess.run([*JOBFENCE, "worker", "--max-jobs", "2"],
                       env=worker_env(dsn, sidecar), capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 1, r.stderr  # the linked one failed
    row = job(dsn, str(snoozing))
    assert (row["status"], row["attempt_count"], row["snoozes"]) == ("pending", 0, 1)
    assert events(dsn, str(snoozing))[-1]["reason"] == "snoozed for PT10M by action 1 (command)"
    row = job(dsn, str(linked))
    assert (row["status"], row["snoozes"]) == ("failed", 0)
    assert row["error"] == ("command exited with 75 to snooze, but its snooze file was "
                            "refused: .jobfence-snooze-0: a symbolic link")


def test_a_commands_whole_output_and_usage_come_back_from_the_sidecar(
        dsn: Dsn, sidecar: Sidecar, s3_env: dict[str, str]) -> None:
    """Through the runner as through a local child: every line to the worker's log, the
    streams whole to S3, what the command used reported with its exit."""
    script = ("import sys, time\nb = bytearray(64 * 2**20)\nb[::4096] = b'x' * len(b[::4096])\n"
              "time.sleep(0.3)\nfor i in range(2000): print(f'{i:07d}')\n"
              "sys.stderr.write('bye\\n')\n")
    job_id = enqueue(dsn, "command:" + json.dumps({"argv": [SYSTEM_PYTHON, "-c", script]}),
                     **s3_env)
    r = subprocess.run([*JOBFENCE, "worker", "--max-jobs", "1"], cwd=REPO, timeout=120,
                       env=worker_env(dsn, sidecar, **s3_env), capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stderr
    [result] = [a["result"] for a in action_results(dsn, job_id)]
    assert result["stdout_bytes"] == 16000 and result["output_on_s3"] is True
    assert 64 * 2**20 <= result["usage"]["peak_memory_bytes"] < 96 * 2**20, result["usage"]
    said = [json.loads(line) for line in r.stderr.splitlines() if '"event": "output"' in line]
    assert [e["line"] for e in said if e["stream"] == "stdout"] == [
        f"{i:07d}" for i in range(2000)][:len([e for e in said if e["stream"] == "stdout"])]
    whole = run_cli(dsn, "logs", job_id, "--stream", "stdout", **s3_env)
    assert whole.stdout == "".join(f"{i:07d}\n" for i in range(2000))
