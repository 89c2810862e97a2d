"""A job's process tree as the worker reads it from /proc: the check before it looks for a
job's leftover processes (a process without children has no descendants — as a subreaper,
orphans come back to it as children — so the /proc scan, milliseconds per job with a few
hundred processes on the node, is skipped), and the scan itself against process names and
stat lines of any bytes."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.worker import proctree

SCRIPT = """
import subprocess
from jobfence.worker.proctree import has_children
seen = [has_children()]
p = subprocess.Popen(["sleep", "30"])
seen.append(has_children())
p.kill()
seen.append(has_children())  # exited, not yet reaped: still a child (and not reaped by us)
p.wait()
seen.append(has_children())
print(seen)
"""


def test_has_children_sees_live_and_unreaped_children_and_reaps_none() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[False, True, True, False]"


# -- hostile process names --------------------------------------------------------------------
# A job controls its processes' names (``/proc/PID/comm``: 15 bytes, anything but NUL): the
# scan of /proc reads every process on the machine, so one name that is not UTF-8 — written
# on purpose, or a non-ASCII executable name the kernel cut mid-character — must be read as
# bytes, never fail the scan (the guards' threads and the job's tree kill run it).

def _fake_proc(tmp: Path, entries: dict[int, bytes]) -> Path:
    for pid, stat in entries.items():
        (tmp / str(pid)).mkdir()
        (tmp / str(pid) / "stat").write_bytes(stat)
    return tmp


@pytest.mark.parametrize("comm", [b"\xff", b"caf\xc3", b"a) (b", b") S 1 2 3", b"\xff)\xfe(",
                                  b"", b"\x00\x01\n"])
def test_a_process_name_of_any_bytes_is_read(tmp_path: Path, comm: bytes) -> None:
    proc = _fake_proc(tmp_path, {
        50: b"50 (init) S 1 50 50 0 -1 4194560 0 0",
        51: b"51 (" + comm + b") S 50 51 51 0 -1 4194560 0 0",
        52: b"52 (sleep) S 51 51 52 0 -1 4194560 0 0"})
    assert [p.pid for p in proctree._below(50, proc)] == [51, 52]
    p = proctree._stat(51, proc)
    assert p is not None and (p.ppid, p.pgrp, p.session, p.state) == (50, 51, 51, "S")


@settings(deadline=None)  # a loaded machine is not a failure
@given(st.binary(max_size=64))
def test_no_stat_line_fails_the_scan(stat: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc = _fake_proc(Path(tmp), {7: stat, 8: b"8 (ok) S 7 8 8 0"})
        assert 8 in [p.pid for p in proctree._below(7, proc)]  # 7's own line aside
        assert proctree._stat(8, proc) is not None


SCRIPT_HOSTILE = r"""
import os, subprocess, sys, time
from jobfence.worker import proctree
assert proctree.become_subreaper()
# A daemon in a session of its own, whose name is not UTF-8 (written by itself, as a job can).
d = subprocess.Popen(["setsid", "-f", "sh", "-c",
                      "printf '\\377\\376' > /proc/$$/comm; sleep 300; :"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
d.wait()  # setsid forked: the daemon is an orphan re-parented to this subreaper
for _ in range(200):
    if any(b"\xff" in open(f"/proc/{p}/stat", "rb").read()
           for p in proctree.descendants(os.getpid())):
        break
    time.sleep(0.01)
else:
    sys.exit("the daemon never renamed itself")
print(proctree.kill_descendants(reap_children=True), proctree.descendants(os.getpid()))
"""


def test_a_daemon_with_a_hostile_name_is_still_found_and_killed() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT_HOSTILE], capture_output=True, text=True,
                       timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "2 []"  # the renamed shell and its sleep
