"""Helpers for tests that drive real worker processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from devtools import readable_site
from devtools.sqlconn import connect
from tests.support import JOBFENCE, REPO, cli_env, role_dsn, run_cli

T = TypeVar("T")

# Short leases so that expiry-driven scenarios take seconds, not minutes.
FAST = {"JOBFENCE_LEASE_SECONDS": "2", "JOBFENCE_HEARTBEAT_SECONDS": "0.4",
        "JOBFENCE_RETRY_BASE_SECONDS": "0", "JOBFENCE_LOG_FORMAT": "json"}


def spawn(dsn: str, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*JOBFENCE, *args], env=cli_env(dsn, args[0] if args else None,
                                                              **{**FAST, **env}), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(fn: Callable[[], T], timeout: float = 20.0, interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(interval)


def job(dsn: str, job_id: str) -> dict[str, Any]:
    with connect(dsn) as conn:
        row = conn.execute("SELECT * FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def events(dsn: str, job_id: str) -> list[dict[str, Any]]:
    with connect(dsn) as conn:
        return conn.execute("SELECT * FROM job_events WHERE job_id = %s ORDER BY event_id",
                            (job_id,)).fetchall()


def action_results(dsn: str, job_id: str) -> list[dict[str, Any]]:
    with connect(dsn) as conn:
        return conn.execute("SELECT * FROM job_action_results WHERE job_id = %s "
                            "ORDER BY finished_at", (job_id,)).fetchall()


def enqueue(dsn: str, *args: str, **env: str) -> str:
    """One job, enqueued as ``jobfence enqueue ARGS`` enqueues it — the command's own parser
    and ``submit``, as the enqueue role's login — but in this process: here it is a test's
    set-up, and a process of its own would cost half a second of CPU for nothing the test
    looks at (the command's process is tested where it is the subject: test_cli_store and
    the other CLI tests run it). A job enqueued with an environment of its own (``PYTHONPATH``
    naming a plugin's actions) goes through the command's process: an environment is a
    process's."""
    if env:
        r = run_cli(dsn, "enqueue", *args, **env)
        assert r.returncode == 0, r.stderr
        return str(json.loads(r.stdout)["job_id"])
    from jobfence.cli import open_store
    from jobfence.functions.enqueue import spec_batches_of
    from jobfence.settings import load_settings
    from jobfence.submit import submit

    settings = load_settings(database_url=role_dsn(dsn, "enqueue"),
                             database_pooler=getattr(dsn, "pooler", "none"))
    first, rest = spec_batches_of(list(args))
    assert not list(rest), "one job"
    with open_store(settings, "enqueue") as store:
        [made] = submit(settings, store, first)
    return str(made.job_id)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or the read
        return False


def read_pid(path: Path, timeout: float = 20.0) -> int:
    return wait_for(lambda: int(path.read_text()) if path.exists() and path.read_text().strip()
                    else 0, timeout)


def log_events(stderr: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def long_then_quick(tmp: Path, seconds: int = 60) -> str:
    """A command that runs long on its first attempt (writing its pid) and exits 0 at once
    on later ones: proves that a later attempt finished the job."""
    mark, pid = tmp / "mark", tmp / "pid"
    script = (f'if [ -e {mark} ]; then exit 0; fi; touch {mark}; echo $$ > {pid}; '
              f'exec sleep {seconds}')
    return json.dumps({"argv": ["sh", "-c", script]})


def kill_quietly(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    p.communicate()


SYSTEM_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
"""The system's Python: a job's command runs as another user, who may not enter root's own
interpreter's directory."""


def _readable_jobfence() -> str:
    """jobfence and the distributions it runs on, copied where every user can read them:
    for a checkout (and its environment) in a folder only root may enter."""
    names = sorted(readable_site.distributions("jobfence") - {"jobfence"})
    installed = Path(sysconfig.get_paths()["purelib"])
    return readable_site.copy("jobfence-site", names, {
        "jobfence": REPO / "shared", "jobfence/functions": REPO / "functions",
        **{d.name: d for d in installed.glob("jobfence-*.dist-info")}})


@cache
def jobfence_as(uid: int) -> tuple[str, ...]:
    """The CLI as ``uid`` can run it: this interpreter when it may, else the system's with
    this environment's packages (the same Python minor version) — or with a readable copy of
    them where this environment lives in a folder ``uid`` may not enter."""
    site = sysconfig.get_paths()["purelib"]
    candidates = [(sys.executable, site), (SYSTEM_PYTHON, site)]
    if not readable_site.others_may_enter(site):
        candidates.append((SYSTEM_PYTHON, _readable_jobfence()))
    for python, where in candidates:
        code = (f"import site, sys; site.addsitedir({where!r}); "
                "from jobfence.functions.cli import main; sys.exit(main(sys.argv[1:]))")
        argv = (python, "-c", code)
        try:
            r = subprocess.run([*argv, "--version"], user=uid, group=uid, extra_groups=[],
                               cwd="/", env={"PYTHONDONTWRITEBYTECODE": "1"},
                               capture_output=True, timeout=60, check=False)
        except PermissionError:
            continue
        if r.returncode == 0:
            return argv
    raise AssertionError(f"no Python here can run jobfence as uid {uid}")


class Sidecar:
    """The command runner as the shipped worker pod runs it: in a PID namespace of its own
    (``unshare --pid --mount-proc``) under a small init, as the pod's tini (the namespace,
    and every process in it, ends with the runner), with an environment that holds no key.
    It dials the worker's socket in ``root/worker/`` (made by the worker, only the worker
    may write it) and keeps the jobs' spaces in ``root/scratch``. As root its children get a
    uid of their own per job; with ``uid``, it runs as that uid, and its children with it,
    as in the restricted pod."""

    def __init__(self, root: Path, uid: int | None = None, **env: str) -> None:
        root.chmod(0o755)
        self.uid = uid
        self.socket = root / "worker" / "command.sock"
        self.scratch = root / "scratch"
        self.scratch.mkdir(mode=0o755)
        runner: tuple[str, ...] = (*JOBFENCE,)
        drop: list[str] = []
        if uid is not None:
            os.chown(self.scratch, uid, uid)
            self.scratch.chmod(0o700)
            runner = jobfence_as(uid)
            drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        # The init stays root (a changed uid would clear its parent-death signal).
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--mount-proc", "--kill-child=SIGKILL", "--",
             "sh", "-c", '"$@" & wait $!', "init", *drop, *runner, "command-runner",
             "--socket", str(self.socket), "--scratch", str(self.scratch)],
            env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1", **env}, cwd="/",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: self.runner_pid() is not None)

    def worker_env(self) -> dict[str, str]:
        """What a worker needs to drive this runner."""
        env = {"JOBFENCE_COMMAND_SOCKET": str(self.socket)}
        if self.uid is not None:
            env["JOBFENCE_COMMAND_RUNNER_UID"] = str(self.uid)
        return env

    def runner_pid(self) -> int | None:
        """The runner's pid (as this machine sees it): the init's child."""
        for pid in _children(self.proc.pid):
            for child in _children(pid):
                return child
        return None

    def stop(self) -> tuple[int, str, str]:
        """SIGTERM the runner, as the kubelet does once the worker's container is done."""
        pid = self.runner_pid()
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        out, err = self.proc.communicate(timeout=20)
        return self.proc.returncode, out, err


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


__all__ = ["FAST", "SYSTEM_PYTHON", "Sidecar", "action_results", "alive", "enqueue", "events",
           "job", "jobfence_as", "kill_quietly", "log_events", "long_then_quick", "read_pid",
           "spawn", "wait_for"]

