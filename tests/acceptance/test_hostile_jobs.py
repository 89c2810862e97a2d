"""A hostile job's code tries every way out of its boundary it can think of, as a real worker
runs it — locally (a root worker: a uid of its own per job, or the fixed ``nobody`` of the
issue's reproduction) and through the command sidecar (a root runner in a PID namespace of
its own) — and every try changes nothing and reaches nothing (invariants 9, 11, 13):

- links in its directories: its output directory replaced by a link to a directory only
  root may read (nothing of it is uploaded; the result says why), its input directory
  replaced by a link before a later action (nothing is written through it), and symbolic
  links, hard links, FIFOs and sockets among its outputs (refused, each with why; only its
  own regular files are uploaded);
- another running job, of another installation, on the same machine: its
  ``/proc/PID/environ`` (the ``env`` secret, the attempt id), its directories (to read, or
  to plant an output), its processes and the workers (signals), the worker's own
  ``/proc`` entries (environment, memory, descriptors), and the descriptors the job itself
  was started with (nothing of the worker's: no connection, socket or lock file).

The file-level rules themselves are fuzzed in ``test_hostile_files.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.sqlconn import connect
from jobfence import db
from jobfence.adapters.s3 import S3ObjectStore
from jobfence.objectstore import parse_s3_url
from jobfence.store import Store
from tests.support import JOBFENCE, Dsn, cli_env, run_cli
from tests.support.factories import enqueue_one
from tests.support.pg import Databases
from tests.support.procs import (
    FAST,
    SYSTEM_PYTHON,
    Sidecar,
    action_results,
    events,
    job,
    kill_quietly,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="other users and PID namespaces need root")

SECRET = "only-root-may-read-this"

WHERE = ["per-job uid", "fixed nobody", "sidecar"]


class Place:
    """Where the jobs' commands run: their worker's environment, and what to clean up."""

    def __init__(self, where: str, root: Path) -> None:
        self.where = where
        self.sidecar = Sidecar(root / "pod") if where == "sidecar" else None
        user = "nobody" if where == "fixed nobody" else ""  # "": a uid of its own per job
        self.env = {"JOBFENCE_COMMAND_USER": user,
                    **(self.sidecar.worker_env() if self.sidecar else {})}

    def close(self) -> None:
        if self.sidecar is not None:
            kill_quietly(self.sidecar.proc)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's temporary root is closed to others)."""
    path = Path(tempfile.mkdtemp(prefix="jobfence-hostile-"))
    path.chmod(0o755)
    (path / "pod").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=WHERE)
def place(request: pytest.FixtureRequest, open_dir: Path) -> Iterator[Place]:
    p = Place(request.param, open_dir)
    yield p
    p.close()


@pytest.fixture
def secret_dir(open_dir: Path) -> Path:
    """A directory only root may read, holding a secret (/root/sec in the issue)."""
    sec = open_dir / "sec"
    sec.mkdir(mode=0o700)
    (sec / "key").write_text(SECRET)
    return sec


def run_worker(dsn: str, place: Place, s3_env: dict[str, str], *args: str,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = cli_env(dsn, "worker", **FAST, **s3_env, **place.env)
    return subprocess.run([*JOBFENCE, "worker", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def bucket_objects(s3_env: dict[str, str]) -> dict[str, bytes]:
    s3 = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"])
    bucket = s3_env["JOBFENCE_S3_BUCKET"]
    return {o.key: s3.get_bytes(bucket, o.key) for o in s3.iter_objects(bucket, "")}


def command(*argv: str, **env: str) -> dict[str, Any]:
    return {"name": "command", "params": {"argv": list(argv), "env": env}}


def test_an_output_directory_replaced_by_a_link_uploads_nothing_of_its_target(
        dsn: Dsn, store: Store, s3_env: dict[str, str], place: Place,
        secret_dir: Path) -> None:
    """Item 1 of the issue: the job makes $JOBFENCE_OUTPUT_DIR a link to a root-only
    directory; before, the worker uploaded the file the job could not read."""
    hostile = enqueue_one(store, actions=[command(
        "bash", "-c", f'rmdir "$JOBFENCE_OUTPUT_DIR" && ln -s {secret_dir} '
                      f'"$JOBFENCE_OUTPUT_DIR" && ! cat "$JOBFENCE_OUTPUT_DIR/key"')])
    r = run_worker(dsn, place, s3_env)
    assert r.returncode == 0, r.stderr
    assert job(dsn, str(hostile))["status"] == "succeeded"
    [result] = [a["result"] for a in action_results(dsn, str(hostile))]
    assert result["outputs"] == []
    assert [o["path"] for o in result["outputs_refused"]] == ["."]
    assert "moved or replaced" in result["outputs_refused"][0]["why"]
    assert not any(SECRET.encode() in data for data in bucket_objects(s3_env).values())
    assert [p.name for p in secret_dir.iterdir()] == ["key"]


def test_an_input_directory_replaced_by_a_link_is_never_written_through(
        dsn: Dsn, s3_env: dict[str, str], place: Place, secret_dir: Path) -> None:
    """Item 1 of the issue: the job makes $JOBFENCE_INPUT_DIR a link to a root-only
    directory; before, the worker wrote the job's inputs there before its next action."""
    s3 = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"])
    bucket = s3_env["JOBFENCE_S3_BUCKET"]
    s3.put_bytes(bucket, "in/planted.txt", b"the submitter's object")
    spec = {"actions": [
        command("bash", "-c", f'cat "$JOBFENCE_INPUT_DIR/planted.txt" && '
                              f'rm -rf "$JOBFENCE_INPUT_DIR" && '
                              f'ln -s {secret_dir} "$JOBFENCE_INPUT_DIR"'),
        command("bash", "-c", '! ls "$JOBFENCE_INPUT_DIR/"')],
        "inputs": f"s3://{bucket}/in/"}
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(spec), **s3_env)
    assert r.returncode == 0, r.stderr
    r = run_worker(dsn, place, s3_env)
    assert r.returncode == 0, r.stderr
    with connect(dsn) as conn:
        [child] = conn.execute("SELECT job_id FROM jobs WHERE parent_id IS NOT NULL")
    [first, _] = action_results(dsn, str(child["job_id"]))
    assert first["result"]["stdout_tail"] == "the submitter's object"
    assert sorted(p.name for p in secret_dir.iterdir()) == ["key"]
    assert (secret_dir / "key").stat().st_uid == 0


MAKE_OUTPUTS = r'''
import os, socket, sys
out, foreign, secret = os.environ["JOBFENCE_OUTPUT_DIR"], sys.argv[1], sys.argv[2]
def at(name):
    return os.path.join(out, name)
with open(at("good.txt"), "w") as f:
    f.write("mine")
os.mkdir(at("sub"))
with open(at("sub/deep.txt"), "w") as f:
    f.write("deep")
os.symlink(os.path.join(secret, "key"), at("link-file"))
os.symlink(secret, at("link-dir"))
os.mkfifo(at("fifo"))
s = socket.socket(socket.AF_UNIX)
s.bind(at("sock"))
with open(at("twice.txt"), "w") as f:
    f.write("twice")
os.link(at("twice.txt"), at("twice-again.txt"))
os.link(foreign, at("foreign.txt"))  # root's, writable by all: the kernel lets it be linked
'''


def test_links_fifos_sockets_and_other_users_files_among_outputs_are_refused(
        dsn: Dsn, store: Store, s3_env: dict[str, str], place: Place, secret_dir: Path,
        open_dir: Path) -> None:
    foreign = open_dir / "foreign.txt"
    foreign.write_text("root's own, not the job's")
    foreign.chmod(0o666)
    hostile = enqueue_one(store, actions=[command(SYSTEM_PYTHON, "-c", MAKE_OUTPUTS,
                                                  str(foreign), str(secret_dir))])
    r = run_worker(dsn, place, s3_env)
    assert r.returncode == 0, r.stderr
    [result] = [a["result"] for a in action_results(dsn, str(hostile))]
    uploaded = {parse_s3_url(u)[1].rsplit("/", 1)[-1] if "/sub/" not in u else "sub/deep.txt"
                for u in result["outputs"]}
    assert uploaded == {"good.txt", "sub/deep.txt"}
    refused = {o["path"]: o["why"] for o in result["outputs_refused"]}
    assert refused == {
        "link-file": "a symbolic link", "link-dir": "a symbolic link", "fifo": "a FIFO",
        "sock": "a socket", "twice.txt": "a hard link (2 names)",
        "twice-again.txt": "a hard link (2 names)",
        "foreign.txt": f"owned by uid 0, not by the job's uid {uid_of(result)}"}, refused
    assert result["outputs_refused_count"] == 7
    contents = sorted(bucket_objects(s3_env).values())
    assert contents == [b"deep", b"mine"]


def uid_of(result: dict[str, Any]) -> int:
    """The job's uid, as the refusal of a foreign file names it."""
    why = next(o["why"] for o in result["outputs_refused"] if o["path"] == "foreign.txt")
    return int(why.rsplit(" ", 1)[1])


# -- two jobs, two installations, one machine ------------------------------------------------

VICTIM = r'''
import os, sys, time
drop = sys.argv[1]
with open(os.path.join(os.environ["JOBFENCE_OUTPUT_DIR"], "mine.txt"), "w") as f:
    f.write("the victim's own")
with open(os.path.join(drop, "victim-running"), "w") as f:
    f.write(os.environ["JOBFENCE_ATTEMPT_ID"])
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(drop, "hostile.json")) and time.monotonic() < deadline:
    time.sleep(0.05)
'''

HOSTILE = r'''
import glob, json, os, re, signal, socket, sys
drop, scratch = sys.argv[1], sys.argv[2]
me, own = os.getuid(), os.environ["JOBFENCE_ATTEMPT_ID"]
report = {"uid": me, "attempt_ids": [], "secrets": 0, "environ_read": [], "signalled": [],
          "proc_of_parent": {}, "dirs_entered": [], "planted": [], "fds": {},
          "env": sorted(os.environ)}
pattern = re.compile(rb"JOBFENCE_ATTEMPT_ID=([0-9a-f-]{36})")
session = os.getsid(0)
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if os.getsid(int(pid)) == session:
            continue  # this job's own processes
    except OSError:
        continue
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
        report["environ_read"].append(pid)
        report["attempt_ids"] += [m.decode() for m in pattern.findall(data)]
        report["secrets"] += data.count(b"VICTIM_SECRET")
    except OSError:
        pass
    try:
        os.kill(int(pid), 0)  # permission to signal, harmlessly
        report["signalled"].append(pid)
    except OSError:
        pass
parent = os.getppid()
for what in ("environ", "mem", "fd", "cmdline"):
    try:
        if what == "fd":
            os.listdir(f"/proc/{parent}/fd")
        else:
            with open(f"/proc/{parent}/{what}", "rb") as f:
                f.read(64)
        report["proc_of_parent"][what] = "read"
    except OSError as exc:
        report["proc_of_parent"][what] = type(exc).__name__
ATTEMPT = "jobfence-" + "-".join("?" * n for n in (8, 4, 4, 4, 12))
for d in glob.glob("/tmp/" + ATTEMPT) + glob.glob(os.path.join(scratch, ATTEMPT)):
    if os.path.realpath(d) == os.path.realpath(os.environ["HOME"]):
        continue
    try:
        os.listdir(d)
        report["dirs_entered"].append(d)
    except OSError:
        pass
    for target in (d, os.path.join(d, "outputs")):
        try:
            with open(os.path.join(target, "planted.txt"), "w") as f:
                f.write("planted")
            report["planted"].append(target)
        except OSError:
            pass
for fd in os.listdir("/proc/self/fd"):
    try:
        report["fds"][fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
with open(os.path.join(drop, "hostile.json"), "w") as f:
    json.dump(report, f)
'''


@pytest.fixture
def other_installation(databases: Databases) -> Iterator[tuple[str, Store]]:
    """Another installation's database on the same server (and machine), and its store."""
    url = databases.create()
    conn = db.connect(url)
    yield url, Store(conn)
    conn.close()
    databases.drop(url)


@pytest.mark.parametrize("where", ["per-job uid", "sidecar"])
def test_a_job_reaches_nothing_of_another_running_job_nor_of_its_worker(
        dsn: Dsn, store: Store, s3_env: dict[str, str],
        other_installation: tuple[str, Store], open_dir: Path, where: str) -> None:
    """Item 6 of the issue: jobs that shared ``nobody`` read each other's environment and
    wrote into each other's outputs; here the victim runs for one installation and the
    hostile job for another, at once, on this machine."""
    drop = open_dir / "drop"
    drop.mkdir()
    drop.chmod(0o777)
    victim_place, hostile_place = Place(where, open_dir), None
    victim = enqueue_one(store, actions=[command(SYSTEM_PYTHON, "-c", VICTIM, str(drop),
                                                 VICTIM_SECRET="a-secret-of-the-victim")])
    other_url, other = other_installation
    hostile = enqueue_one(other, actions=[command(
        SYSTEM_PYTHON, "-c", HOSTILE, str(drop),
        str(victim_place.sidecar.scratch if victim_place.sidecar else "/nonexistent"))])
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(subprocess.Popen(
            [*JOBFENCE, "worker"], env=cli_env(dsn, "worker", **FAST, **s3_env,
                                               **victim_place.env),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 30
        while not (drop / "victim-running").exists():
            assert time.monotonic() < deadline and procs[0].poll() is None, \
                procs[0].communicate()
            time.sleep(0.05)
        hostile_place = Place(where, _fresh(open_dir)) if where == "sidecar" else victim_place
        procs.append(subprocess.Popen(
            [*JOBFENCE, "worker"], env=cli_env(other_url, "worker", **FAST,
                                               **s3_env, **hostile_place.env),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            kill_quietly(p)
        victim_place.close()
        if hostile_place is not None and hostile_place is not victim_place:
            hostile_place.close()
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    report = json.loads((drop / "hostile.json").read_text())
    victim_attempt = (drop / "victim-running").read_text()
    assert victim_attempt not in report["attempt_ids"] and report["secrets"] == 0, report
    assert report["environ_read"] == [] and report["signalled"] == [], report
    assert report["proc_of_parent"] == {"environ": "PermissionError", "mem": "PermissionError",
                                        "fd": "PermissionError", "cmdline": "read"}, report
    assert report["dirs_entered"] == [] and report["planted"] == [], report
    # Its descriptors: stdin (/dev/null) and its two output pipes; nothing of its worker's or
    # runner's (the listing's own descriptor was closed before it was read).
    fds = report["fds"]
    assert fds.pop("0") == "/dev/null"
    assert fds.pop("1").startswith("pipe:") and fds.pop("2").startswith("pipe:")
    assert fds == {}, report["fds"]
    assert not any(k.startswith(("JOBFENCE_DATABASE", "AWS_", "PG")) for k in report["env"])
    # The victim's job is as its own code left it: its one output, nothing planted.
    assert job(dsn, str(victim))["status"] == "succeeded"
    [result] = [a["result"] for a in action_results(dsn, str(victim))]
    assert [u.rsplit("/", 1)[1] for u in result["outputs"]] == ["mine.txt"]
    assert "outputs_refused" not in result
    assert [e["to_status"] for e in events(dsn, str(victim))] == [
        "pending", "running", "succeeded"]
    assert job(other_url, str(hostile))["status"] == "succeeded"
    assert report["uid"] not in (0, 65534)  # a uid of its own


def _fresh(open_dir: Path) -> Path:
    path = Path(tempfile.mkdtemp(dir=open_dir))
    (path / "pod").mkdir()
    return path

