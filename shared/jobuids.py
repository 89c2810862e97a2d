"""Who a job's child runs as (``JOBFENCE_COMMAND_USER``), and a uid of its own per job.

Jobs that share a machine must not share a user: a process may read the
``/proc/PID/environ`` of every process of its own uid (a job's ``JOBFENCE_ATTEMPT_ID`` and
its spec's ``env`` secrets), signal it, and write into whatever that uid owns. So where the
process that starts children may switch users (it runs as root) and no fixed user is
configured, each running job — one attempt, all of its actions — gets a uid of its own:

- taken from ``JOBFENCE_COMMAND_UIDS`` (default 1900000000-1900065535: above every range a
  distribution, systemd or a container runtime hands out — regular users end at 60000,
  systemd's dynamic users at 65519, nspawn's container ranges at 1879048191 — and below
  2^31; a uid or gid that has an entry in the user or group database is skipped);
- unique across every worker process, every installation and every command sidecar on the
  machine: each holds ``flock`` on ``/run/jobfence-uids/<uid>`` (a directory only root may
  enter) for as long as its job runs, and the kernel lets go when the process dies, however
  it dies; uids are handed out round-robin, so one comes back only after all the others;
- when its job is done, every process left with the uid is killed (``kill(-1, SIGKILL)``
  from a process of that uid: one atomic sweep that no fork escapes), the job's directories
  and what it left at the top of ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are removed, and
  only then is the uid free again; a uid whose holder died before that is swept the same
  way before it is handed out again (its lock file still says ``held``).

``JOBFENCE_COMMAND_USER`` set to a name or ``UID[:GID]`` runs every job as that one user
instead; ``worker`` — and any process that is not root — keeps the process's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jobfence.errors import ConfigError, NoFreeUid
from jobfence.fsboundary import DIR_FLAGS, BoundaryError, open_dir, remove_owned

DEFAULT_UIDS = "1900000000-1900065535"
LOCK_DIR = Path("/run/jobfence-uids")
SWEPT = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))  # noqa: S108 - swept, not used
"""World-writable directories where a job's user may leave files behind."""

SAME_USER = "worker"
"""JOBFENCE_COMMAND_USER's value for a child that keeps the worker's user."""


@dataclass
class JobUser:
    """The user one job's children run as, for as long as the job runs."""

    uid: int | None = None
    """None: this process's own user."""
    gid: int | None = None
    lease: UidLease | None = None

    @property
    def effective_uid(self) -> int:
        return self.uid if self.uid is not None else os.geteuid()

    @property
    def owner(self) -> tuple[int, int] | None:
        """What the job's directories and files are handed to (None: this process's)."""
        if self.uid is None or self.gid is None:
            return None
        return self.uid, self.gid

    def popen_args(self) -> dict[str, Any]:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def release(self, then: Callable[[], object] = lambda: None) -> None:
        """The job is done: kill every process of its own uid (nothing for a shared one),
        run ``then`` (remove the job's directories), and only then let the uid go."""
        lease, self.lease = self.lease, None
        if lease is None:
            then()
            return
        lease.release(then)


class Users(Protocol):
    def take(self) -> JobUser:
        """The user for one job's children; ``release`` it when the job is done."""
        ...


class SameUser:
    def take(self) -> JobUser:
        return JobUser()


@dataclass(frozen=True)
class FixedUser:
    uid: int
    gid: int

    def take(self) -> JobUser:
        return JobUser(self.uid, self.gid)


def resolve_user(user: str) -> tuple[int, int]:
    """``name`` or ``uid[:gid]`` → (uid, gid); ValueError when no such user."""
    if user.replace(":", "").isdigit():
        uid, _, gid = user.partition(":")
        return int(uid), int(gid or uid)
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"JOBFENCE_COMMAND_USER: no user named {user!r}") from None
    return entry.pw_uid, entry.pw_gid


def parse_uids(text: str) -> range:
    """``FIRST-LAST`` → the uids (ValueError when it is not a range of ordinary uids)."""
    first, sep, last = text.partition("-")
    if not (sep and first.strip().isdigit() and last.strip().isdigit()):
        raise ValueError(f"JOBFENCE_COMMAND_UIDS: {text!r} is not FIRST-LAST")
    lo, hi = int(first), int(last)
    if not 1000 <= lo <= hi <= 0xFFFFFFFE:
        raise ValueError("JOBFENCE_COMMAND_UIDS: FIRST must be at least 1000 and at most "
                         "LAST, LAST below 4294967295")
    if lo <= 65535 <= hi or lo <= 65534 <= hi:
        raise ValueError("JOBFENCE_COMMAND_UIDS must not hold 65534 (nobody) or 65535")
    return range(lo, hi + 1)


def users_for(user: str | None, uids: str = DEFAULT_UIDS) -> Users:
    """The policy ``JOBFENCE_COMMAND_USER`` and ``JOBFENCE_COMMAND_UIDS`` ask for, as far
    as this process may switch users (only root may)."""
    if os.geteuid() != 0 or user == SAME_USER:
        return SameUser()
    if user:
        return FixedUser(*resolve_user(user))
    return PerJobUsers(parse_uids(uids))


def _known(uid: int) -> bool:
    """Whether a real user or group has this id."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


@dataclass
class PerJobUsers:
    """A uid of its own per job, from ``uids``, unique on the machine (module docstring)."""

    uids: range
    lock_dir: Path = LOCK_DIR
    swept: tuple[Path, ...] = SWEPT
    _dir_fd: int | None = field(default=None, repr=False)

    def _lock_dir(self) -> int:
        if self._dir_fd is None:
            try:
                parent = os.open(self.lock_dir.parent, DIR_FLAGS)
                try:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(self.lock_dir.name, 0o700, dir_fd=parent)
                    fd = open_dir(parent, self.lock_dir.name)
                finally:
                    os.close(parent)
            except (OSError, BoundaryError) as exc:
                raise ConfigError(f"per-job uids need {self.lock_dir}: {exc}") from None
            st = os.fstat(fd)
            if st.st_uid != 0 or st.st_mode & 0o077:
                os.close(fd)
                raise ConfigError(f"{self.lock_dir} must be root's alone (mode 0700): per-job "
                                  "uids are only unique while no one else can take them")
            self._dir_fd = fd
        return self._dir_fd

    def take(self) -> JobUser:
        dir_fd = self._lock_dir()
        n = len(self.uids)
        with _locked(dir_fd):
            cursor = os.open("next", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=dir_fd)
            try:
                text = os.pread(cursor, 32, 0).decode(errors="replace").strip()
                start = int(text) % n if text.isdigit() else 0
                for i in range(n):
                    uid = self.uids[(start + i) % n]
                    if _known(uid):
                        continue
                    fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        os.close(fd)
                        continue
                    os.ftruncate(cursor, 0)
                    os.pwrite(cursor, str((start + i + 1) % n).encode(), 0)
                    break
                else:
                    raise NoFreeUid(f"every uid of JOBFENCE_COMMAND_UIDS ({self.uids.start}-"
                                    f"{self.uids.stop - 1}) is held by a running job")
            finally:
                os.close(cursor)
        lease = UidLease(uid, fd, self.swept)
        try:
            if os.pread(fd, 16, 0) == HELD:
                lease.clean()  # its last holder died with it: what its job left goes now
            os.ftruncate(fd, 0)
            os.pwrite(fd, HELD, 0)
        except BaseException:
            os.close(fd)
            raise
        return JobUser(uid, uid, lease)


HELD = b"held\n"
"""What a uid's lock file says while a job has the uid. Still there when the lock is free,
it says that the holder died before it cleaned up: the next holder does. (A new lock file
is empty, one cleaned up after says ``released``: only root starts a process of a uid, so
neither has anything to kill.)"""
RELEASED = b"released\n"


@dataclass
class UidLease:
    """One uid held for one job: its lock file's descriptor (close-on-exec: no child
    inherits it) holds the ``flock``."""

    uid: int
    fd: int
    swept: tuple[Path, ...]

    def clean(self, then: Callable[[], object] = lambda: None) -> None:
        kill_uid(self.uid)
        then()
        for path in self.swept:
            try:
                fd = os.open(path, DIR_FLAGS)
            except OSError:
                continue
            try:
                remove_owned(fd, self.uid)
            finally:
                os.close(fd)

    def release(self, then: Callable[[], object] = lambda: None) -> None:
        try:
            self.clean(then)
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, RELEASED, 0)
        finally:
            os.close(self.fd)  # the flock goes with it


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (its real or saved uid), from a short-lived helper
    process of that uid: ``kill(-1)`` reaches exactly what the uid may signal, all at once,
    so that no process forks its way past the sweep."""
    import ctypes
    import subprocess

    if uid == 0 or uid == os.geteuid():
        raise ValueError("kill_uid is for a job's own uid only")
    libc_kill = ctypes.CDLL(None, use_errno=True).kill

    def kill_all_then_exit() -> None:
        """In the helper, once it is the uid: signal every process of that uid (the kernel
        spares the sender), then leave without exec'ing anything."""
        libc_kill(-1, signal.SIGKILL)
        os._exit(0)

    helper = subprocess.Popen(  # nothing is exec'd: the helper exits first
        ["true"], user=uid, group=uid, extra_groups=[], close_fds=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=kill_all_then_exit)  # noqa: PLW1509 - one libc call, then _exit
    helper.wait()
