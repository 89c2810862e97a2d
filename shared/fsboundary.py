"""A job's directories, reached only through descriptors (invariant 13).

A job's code can write its own directories: it may plant a symbolic link, a FIFO, a
socket, a device node or a hard link there, or replace a directory by a link to somewhere
else. The worker (root on a machine of its own, or a process holding keys) and the command
sidecar on its behalf must never be turned by that into reading or writing anywhere else.
So nothing here resolves a path the job could have changed:

- a directory is made with ``mkdir`` (which never follows or reuses what is there) and
  opened at once with ``O_NOFOLLOW | O_DIRECTORY``; everything under it is reached from
  that descriptor (``dir_fd=``), one name at a time, each opened ``O_NOFOLLOW``;
- a file is created ``O_CREAT | O_EXCL | O_NOFOLLOW``: never an existing file, never
  through a link;
- a tree is listed with ``stat(follow_symlinks=False)`` and only *regular files owned by
  the job's uid with one name* are accepted; everything else is refused with a reason. A
  file owned by anyone else (a hard link to a file the job cannot read, or one that some
  other user's process put there) is refused, and so is a second name of the job's own
  file: the job's uid could read every accepted file itself, so uploading it exports
  nothing the job could not already have written;
- an accepted file is opened again only by walking its listed path component by component
  from the directory's descriptor, ``O_NOFOLLOW`` at each step, and ``fstat`` must show the
  very inode that was listed, still a regular file, still the job's, still with one name;
- a tree is removed through descriptors too, never following a link.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""O_NONBLOCK: opening a FIFO that replaced a listed file never blocks (fstat refuses it)."""
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

MAX_DEPTH = 64
"""Directories deeper than this in a job's outputs are refused (each level holds a
descriptor while it is listed)."""


class BoundaryError(Exception):
    """A path that would cross the boundary (a link, an existing file, a name that leaves
    its directory); the message says which and why."""


@dataclass(frozen=True, slots=True)
class Listed:
    """A regular file of the job's, as it was listed: what it must still be when opened."""

    path: str
    size: int
    dev: int
    ino: int


@dataclass(frozen=True, slots=True)
class Refused:
    """Something in a job's outputs that is not uploaded, and why."""

    path: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "why": self.why}


def open_dir(parent_fd: int, name: str) -> int:
    """The directory ``name`` in ``parent_fd``: never through a link (BoundaryError)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except (NotADirectoryError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise BoundaryError(f"{name}: not a directory (a link or another kind of file?): "
                            f"{exc.strerror or exc}") from exc


def make_dir(parent_fd: int, name: str, mode: int = 0o700,
             owner: tuple[int, int] | None = None) -> int:
    """Make the new directory ``name`` in ``parent_fd`` and return its descriptor. It must
    not exist yet (a name the job chose first is refused), and the descriptor must be the
    directory this process just made."""
    os.mkdir(name, mode, dir_fd=parent_fd)
    fd = open_dir(parent_fd, name)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise BoundaryError(f"{name}: replaced while it was being made")
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)  # whatever the umask took away
    except BaseException:
        os.close(fd)
        raise
    return fd


def same_entry(parent_fd: int, name: str, fd: int) -> bool:
    """Whether ``name`` in ``parent_fd`` is still the directory open as ``fd`` (a job may
    have renamed it and put a link or another directory under its name)."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def relative_parts(rel: str) -> tuple[str, ...]:
    """The components of a relative path that stays inside its directory; BoundaryError
    for an absolute path, ``..``, an empty path or a NUL."""
    if "\0" in rel:
        raise BoundaryError(f"{rel!r}: a name may not hold NUL")
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise BoundaryError(f"{rel!r}: not a path inside the directory")
    return path.parts


def create_file(root_fd: int, rel: str, mode: int = 0o644,
                owner: tuple[int, int] | None = None) -> BinaryIO:
    """Create the new file ``rel`` under ``root_fd`` (and the directories leading to it),
    open for writing. Nothing is followed: a link or a file anywhere on the way is refused."""
    *dirs, name = relative_parts(rel)
    fd = os.dup(root_fd)
    try:
        for part in dirs:
            try:
                nxt = make_dir(fd, part, 0o755, owner)
            except FileExistsError:
                nxt = open_dir(fd, part)
            os.close(fd)
            fd = nxt
        try:
            out = os.open(name, CREATE_FLAGS, mode, dir_fd=fd)
        except FileExistsError:
            raise BoundaryError(f"{rel}: already exists") from None
        except OSError as exc:
            raise BoundaryError(f"{rel}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    try:
        if owner is not None:
            os.fchown(out, *owner)
        os.fchmod(out, mode)
    except BaseException:
        os.close(out)
        raise
    return os.fdopen(out, "wb")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def refusal(st: os.stat_result, uid: int) -> str | None:
    """Why a file that ``stat`` describes is not the job's to upload; None when it is."""
    if not stat.S_ISREG(st.st_mode):
        return _kind(st.st_mode)
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by the job's uid {uid}"
    if st.st_nlink != 1:
        return f"a hard link ({st.st_nlink} names)"
    return None


def list_files(root_fd: int, uid: int) -> tuple[list[Listed], list[Refused]]:
    """Every regular file under ``root_fd`` the job's ``uid`` owns with one name, in path
    order; and what was refused, with why. Nothing is followed or opened but directories."""
    listed: list[Listed] = []
    refused: list[Refused] = []
    stack: list[tuple[str, int, int]] = [("", os.dup(root_fd), 0)]
    try:
        while stack:
            prefix, dfd, depth = stack.pop()
            try:
                names = sorted(os.listdir(dfd), reverse=True)
                subdirs: list[tuple[str, int, int]] = []
                for name in names:
                    rel = prefix + name
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        if depth + 1 > MAX_DEPTH:
                            refused.append(Refused(rel, f"deeper than {MAX_DEPTH} directories"))
                            continue
                        try:
                            sub = open_dir(dfd, name)
                        except (BoundaryError, OSError) as exc:
                            refused.append(Refused(rel, f"cannot be opened: {exc}"))
                            continue
                        held = os.fstat(sub)
                        if (held.st_dev, held.st_ino) != (st.st_dev, st.st_ino):
                            os.close(sub)
                            refused.append(Refused(rel, "changed while it was listed"))
                            continue
                        subdirs.append((rel + "/", sub, depth + 1))
                        continue
                    why = refusal(st, uid)
                    if why is None:
                        listed.append(Listed(rel, st.st_size, st.st_dev, st.st_ino))
                    else:
                        refused.append(Refused(rel, why))
                stack.extend(reversed(subdirs))  # popped in name order
            finally:
                os.close(dfd)
    finally:
        for _, dfd, _ in stack:
            os.close(dfd)
    listed.sort(key=lambda f: f.path)
    refused.sort(key=lambda r: r.path)
    return listed, refused


def open_listed(root_fd: int, item: Listed, uid: int) -> BinaryIO | str:
    """``item`` opened for reading, reached from ``root_fd`` without following anything;
    or why not (it is no longer the regular file of the job's that was listed)."""
    try:
        *dirs, name = relative_parts(item.path)
    except BoundaryError as exc:
        return str(exc)
    fd = os.dup(root_fd)
    try:
        for part in dirs:
            nxt = open_dir(fd, part)
            os.close(fd)
            fd = nxt
        out = os.open(name, READ_FLAGS, dir_fd=fd)
    except (BoundaryError, OSError):
        return "changed since it was listed"
    finally:
        os.close(fd)
    st = os.fstat(out)
    why = refusal(st, uid)
    if why is None and (st.st_dev, st.st_ino) != (item.dev, item.ino):
        why = "changed since it was listed"
    if why is not None:
        os.close(out)
        return why
    return os.fdopen(out, "rb")


def read_small(dir_fd: int, name: str, uid: int, limit: int) -> bytes | None:
    """The content of ``name``, a regular file of the job's ``uid`` with one name directly
    in the directory open as ``dir_fd``, of at most ``limit`` bytes; None when there is no
    such name. BoundaryError says why anything else is refused (a link, a FIFO, a device,
    another user's file, a longer one). It is looked at before it is opened (a device is
    never opened) and must still be that inode once open; at most ``limit + 1`` bytes are
    ever read, however much the job writes meanwhile."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise BoundaryError(f"{name!r}: not a name in the directory")
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BoundaryError(f"{name}: {exc.strerror or exc}") from exc
    why = refusal(st, uid) or (f"longer than {limit} bytes" if st.st_size > limit else None)
    if why is not None:
        raise BoundaryError(f"{name}: {why}")
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise BoundaryError(f"{name}: changed while it was read") from exc
    try:
        held = os.fstat(fd)
        if refusal(held, uid) is not None or (held.st_dev, held.st_ino) != (st.st_dev, st.st_ino):
            raise BoundaryError(f"{name}: changed while it was read")
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > limit:
        raise BoundaryError(f"{name}: longer than {limit} bytes")
    return data


def check_regular(f: BinaryIO, what: str) -> None:
    """A descriptor handed over by another process must be a regular file's."""
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        raise BoundaryError(f"{what}: not a regular file")


def _entries(dfd: int) -> Iterator[tuple[str, os.stat_result]]:
    for name in os.listdir(dfd):
        with contextlib.suppress(OSError):
            yield name, os.stat(name, dir_fd=dfd, follow_symlinks=False)


def _open_for_removal(parent_fd: int, name: str) -> int:
    """A directory to empty, even one its owner made unreadable (made 0700 again through
    an ``O_PATH`` descriptor, so that a link is never what gets its mode changed)."""
    try:
        return open_dir(parent_fd, name)
    except (BoundaryError, PermissionError):
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC,
                          dir_fd=parent_fd)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
        finally:
            os.close(path_fd)
        return open_dir(parent_fd, name)


def empty_dir(fd: int, max_depth: int = 4 * MAX_DEPTH) -> bool:
    """Remove everything in the directory open as ``fd``, following nothing; whether it is
    empty now. A job may have made its directories read-only: they are made writable again
    first (where this process may)."""
    ok = True
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o700)
    for name, st in list(_entries(fd)):
        try:
            if stat.S_ISDIR(st.st_mode):
                if max_depth <= 0:
                    ok = False
                    continue
                sub = _open_for_removal(fd, name)
                try:
                    ok = empty_dir(sub, max_depth - 1) and ok
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
        except (BoundaryError, OSError):
            ok = False
    return ok


def remove_dir(parent_fd: int, name: str, fd: int) -> bool:
    """Empty the directory open as ``fd`` and remove it from ``parent_fd`` when ``name``
    there is still that directory; whether it is gone."""
    ok = empty_dir(fd)
    if ok and same_entry(parent_fd, name, fd):
        try:
            os.rmdir(name, dir_fd=parent_fd)
            return True
        except OSError:
            return False
    return False


def remove_owned(dir_fd: int, uid: int) -> int:
    """Remove every entry of the directory open as ``dir_fd`` that ``uid`` owns (what a
    job's user left in /tmp or /dev/shm); how many went. Other users' entries of a sticky
    directory cannot be renamed or replaced by ``uid``, so the name stays its entry."""
    gone = 0
    for name, st in list(_entries(dir_fd)):
        if st.st_uid != uid:
            continue
        try:
            if stat.S_ISDIR(st.st_mode):
                sub = _open_for_removal(dir_fd, name)
                try:
                    if remove_dir(dir_fd, name, sub):
                        gone += 1
                finally:
                    os.close(sub)
            else:
                os.unlink(name, dir_fd=dir_fd)
                gone += 1
        except (BoundaryError, OSError):
            continue
    return gone
