"""The command sidecar, as the shipped worker pod runs it (``jobfence.sidecar``).

The runner runs as a container of its own would: in a PID namespace of its own (``unshare
--pid --mount-proc``: it sees only itself and its children), with an environment that holds
no key, starting children as another user; the worker reaches it only through the socket
in a directory both share. Each test drives a real worker against it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.proctree import Tail
from jobfence.sandbox import ChildNotStarted, Sandbox
from jobfence.sidecar import Channel, CommandRunner, ProtocolError, RemoteChild, parse_start
from jobfence.store import Store
from tests.acceptance.test_least_privilege import SEARCH, servers
from tests.conftest import JOBFENCE, Dsn, cli_env, run_cli
from tests.factories import enqueue_one
from tests.procs import FAST, action_results, events, job, kill_quietly, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="a PID namespace of its own needs root and unshare")

PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
"""The system's Python: the children run as ``nobody``, who may not enter root's own."""


class Sidecar:
    def __init__(self, shared: Path) -> None:
        self.socket = shared / "runner.sock"
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--mount-proc", "--kill-child=SIGTERM", "--",
             *JOBFENCE, "command-runner", "--socket", str(self.socket)],
            env={"PATH": os.environ["PATH"], "JOBFENCE_COMMAND_USER": "nobody",
                 "PYTHONDONTWRITEBYTECODE": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(self.socket.exists)

    def stop(self) -> tuple[int, str, str]:
        """SIGTERM the runner, as the kubelet does once the worker's container is done
        (unshare itself does not pass it on)."""
        [runner] = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        os.kill(int(runner), signal.SIGTERM)
        out, err = self.proc.communicate(timeout=20)
        return self.proc.returncode, out, err


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """The emptyDir both containers mount: the socket and the attempts' directories. Open
    to the children's user (pytest's own temporary root is not)."""
    path = Path(tempfile.mkdtemp(prefix="jobfence-sidecar-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sidecar(shared_dir: Path) -> Iterator[Sidecar]:
    runner = Sidecar(shared_dir)
    yield runner
    kill_quietly(runner.proc)


def worker_env(dsn: str, sidecar: Sidecar, **extra: str) -> dict[str, str]:
    return cli_env(dsn, "worker", **FAST, JOBFENCE_COMMAND_SOCKET=str(sidecar.socket),
                   TMPDIR=str(sidecar.socket.parent), **extra)


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
    drop = sidecar.socket.parent / "drop"
    drop.mkdir()
    drop.chmod(0o777)
    report = drop / "report.json"
    home = sidecar.socket.parent / "home"
    home.mkdir()
    env = worker_env(dsn, sidecar)
    (home / ".pgpass").write_text(env["JOBFENCE_DATABASE_URL"] + "\n")
    (home / ".pgpass").chmod(0o600)
    hostile = enqueue_one(store, actions=[
        {"name": "command", "params": {"argv": [PYTHON, "-c", SEARCH, str(report),
                                                str(home), str(home), servers(dsn)]}},
        {"name": "command", "params": {"argv": [
            "sh", "-c", "echo out-line; echo err-line >&2; ls /proc | grep -c '^[0-9]'"]}}])
    r = subprocess.run([*JOBFENCE, "worker"], env={**env, "HOME": str(home)}, cwd=home,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    found = json.loads(report.read_text())
    assert found["uid"] != 0 and found["found"] == [] and found["tried"] == [], found
    assert not any(k.startswith(("JOBFENCE_DATABASE", "AWS_", "PG")) for k in found["env"])
    # Its own PID namespace: the runner, the shell and ls (the worker is not there).
    [_, second] = action_results(dsn, str(hostile))
    assert second["result"]["exit_code"] == 0
    assert second["result"]["stdout_tail"].splitlines()[0] == "out-line"
    assert int(second["result"]["stdout_tail"].splitlines()[1]) <= 4
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
    # The runner serves the next worker, and stops on SIGTERM (exit 0, one JSON line).
    ok = enqueue_one(store, actions=[{"name": "command", "params": {"argv": ["true"]}}])
    assert run_cli(dsn, "cancel", str(killed)).returncode == 0
    r = subprocess.run([*JOBFENCE, "worker"], env=worker_env(dsn, sidecar),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and job(dsn, str(ok))["status"] == "succeeded", r.stderr
    code, out, err = sidecar.stop()
    assert code == 0, err
    assert json.loads(out) == {"function": "command-runner", "served": 2}


# -- the protocol, in-process ----------------------------------------------------------------


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[CommandRunner]:
    served = CommandRunner(tmp_path / "runner.sock", Sandbox())
    thread = threading.Thread(target=served.serve, daemon=True)
    thread.start()
    wait_for(served.path.exists)
    yield served
    served.stop()
    thread.join(timeout=5)


def _raw(runner: CommandRunner, data: bytes) -> dict[str, object] | None:
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(runner.path))
    except OSError:
        sock.close()
        raise
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    channel = Channel(sock)
    try:
        return channel.receive()
    finally:
        channel.close()


def test_the_runner_refuses_what_is_not_the_protocol_and_goes_on(
        runner: CommandRunner, tmp_path: Path) -> None:
    for data in (b"not json\n", b"[1]\n", b'{"start": {"argv": []}}\n',
                 b'{"start": {"argv": ["x"], "cwd": "relative", "env": {}}}\n',
                 b'{"kill": true}\n'):
        reply = _raw(runner, data)
        assert reply is not None and str(reply["error"]).startswith("command sidecar:"), data
    assert _raw(runner, b"") is None  # a connection closed at once: nothing to say
    child = RemoteChild.start(runner.path, ["sh", "-c", "printf '%s' \"$X\"; exit 4"],
                              tmp_path, {"X": "from the env", "PATH": os.defpath})
    assert wait_for(lambda: child.wait(0.1) is not None) and child.wait(0) == 4
    child.close()
    assert child.output() == ("from the env", "")
    assert runner.served == 1


def test_a_remote_childs_output_keeps_its_tail(runner: CommandRunner, tmp_path: Path) -> None:
    child = RemoteChild.start(runner.path, [sys.executable, "-c",
                              "import sys; sys.stdout.write('x' * 300000 + 'END')"],
                              tmp_path, {})
    assert wait_for(lambda: child.wait(0.1) == 0)
    child.close()
    tail = Tail()
    tail.add(b"x" * 300000 + b"END")
    assert child.output()[0] == tail.text() and child.output()[0].endswith("END")


def test_no_runner_on_the_socket_is_a_clear_refusal(tmp_path: Path) -> None:
    with pytest.raises(ChildNotStarted, match=r"is not answering after 0\.2 s"):
        RemoteChild.start(tmp_path / "nobody-listens.sock", ["true"], tmp_path, {},
                          connect_seconds=0.2)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
       | st.fixed_dictionaries({"start": st.fixed_dictionaries({
           "argv": st.lists(st.text(), max_size=3), "cwd": st.text(),
           "env": st.dictionaries(st.text(), st.text(), max_size=3)})}))
def test_a_first_message_is_a_start_or_a_protocol_error(message: object) -> None:
    if not isinstance(message, dict):
        return  # Channel.receive refuses anything but an object before parse_start
    try:
        start = parse_start(message)
    except ProtocolError:
        return
    assert start.argv and start.argv[0] and start.cwd.is_absolute()
    assert all("=" not in k and k for k in start.env)
