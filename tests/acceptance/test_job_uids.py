"""A uid of its own per running job (``jobfence.jobuids``), with real processes and real
uids as root: two holders never get the same uid, one that dies lets go of its uid (the
kernel drops its lock) and what it left running as that uid is killed before the uid serves
another job, a released uid takes its processes and its files in /tmp-like directories
with it, a lock directory anyone else could write is refused, and the settings are checked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobfence.errors import ConfigError, NoFreeUid
from jobfence.jobuids import DEFAULT_UIDS, FixedUser, PerJobUsers, SameUser, parse_uids, users_for
from tests.support.procs import alive, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")

FIRST = 1899100000
"""A small range of our own (not the default one other tests use at the same time)."""


@pytest.fixture
def where() -> Iterator[tuple[Path, Path]]:
    """A lock directory and a directory standing in for /tmp."""
    root = Path(tempfile.mkdtemp(prefix="jf-uids-"))
    root.chmod(0o755)
    swept = root / "tmp"
    swept.mkdir(mode=0o1777)
    swept.chmod(0o1777)
    yield root / "locks", swept
    subprocess.run(["rm", "-rf", str(root)], check=False)


def pool(where: tuple[Path, Path], size: int = 3, offset: int = 0) -> PerJobUsers:
    locks, swept = where
    return PerJobUsers(range(FIRST + offset, FIRST + offset + size), lock_dir=locks,
                       swept=(swept,))


def as_uid(uid: int, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), user=uid, group=uid, extra_groups=[],
                            start_new_session=True, cwd="/")


def test_holders_never_share_a_uid_and_a_full_range_is_a_clear_error(
        where: tuple[Path, Path]) -> None:
    one, two = pool(where), pool(where)  # as two worker processes would
    taken = [one.take(), two.take(), one.take()]
    assert sorted(u.uid for u in taken if u.uid) == [FIRST, FIRST + 1, FIRST + 2]
    assert all(u.owner == (u.uid, u.uid) for u in taken)
    with pytest.raises(NoFreeUid, match="is held by a running job"):
        two.take()
    taken[1].release()
    again = two.take()
    assert again.uid == taken[1].uid  # the only one free
    for u in (taken[0], taken[2], again):
        u.release()
    assert (where[0].stat().st_mode & 0o777) == 0o700


def test_a_holder_that_dies_lets_go_and_what_it_left_running_is_killed(
        where: tuple[Path, Path]) -> None:
    locks, _ = where
    code = (f"import sys, time; sys.path[:0] = {sys.path!r}; "
            "from jobfence.jobuids import PerJobUsers; "
            f"u = PerJobUsers(range({FIRST}, {FIRST + 1}), lock_dir=__import__('pathlib')"
            f".Path({str(locks)!r}), swept=()).take(); print(u.uid, flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    assert int(holder.stdout.readline()) == FIRST
    with pytest.raises(NoFreeUid):
        pool(where, size=1).take()  # held by the other process
    orphan = as_uid(FIRST, "sleep", "300")  # left behind by the holder's job
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
    user = pool(where, size=1).take()
    assert user.uid == FIRST
    wait_for(orphan.poll, timeout=10)
    assert orphan.returncode == -signal.SIGKILL
    user.release()


def test_a_released_uid_takes_its_processes_and_files_with_it(
        where: tuple[Path, Path]) -> None:
    _, swept = where
    user = pool(where, size=1, offset=10).take()
    assert user.uid is not None
    kept = swept / "other-users-file"
    kept.write_text("root's")
    daemon = as_uid(user.uid, "sh", "-c", f"echo left > {swept}/left-behind; "
                                          f"mkdir -p {swept}/dir/sub; exec sleep 300")
    wait_for((swept / "dir" / "sub").exists)
    user.release()
    wait_for(lambda: daemon.poll() is not None, timeout=10)
    assert not alive(daemon.pid)
    assert sorted(p.name for p in swept.iterdir()) == ["other-users-file"]


def test_a_lock_directory_others_could_write_is_refused(where: tuple[Path, Path]) -> None:
    locks, _ = where
    locks.mkdir(mode=0o755)
    locks.chmod(0o755)
    with pytest.raises(ConfigError, match="must be root's alone"):
        pool(where).take()


def test_the_settings_of_the_users() -> None:
    assert parse_uids(DEFAULT_UIDS) == range(1900000000, 1900065536)
    for wrong in ("1-2", "70000", "70000-69999", "60000-70000", "x-y", "1000-4294967295"):
        with pytest.raises(ValueError, match="JOBFENCE_COMMAND_UIDS"):
            parse_uids(wrong)
    assert isinstance(users_for(None), PerJobUsers)
    assert isinstance(users_for("worker"), SameUser)
    assert users_for("nobody") == FixedUser(65534, 65534)
    assert users_for("1234:5678") == FixedUser(1234, 5678)
    with pytest.raises(ValueError, match="no user named"):
        users_for("no-such-user-here")
