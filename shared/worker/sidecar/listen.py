"""The worker's listening socket for its command sidecar (``jobfence.worker.sidecar.link``
takes the one connection it will ever take on it): in a directory that only the worker's
user may write, so that no one else can put a socket of their own under its name."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from jobfence.errors import ConfigError


def listen(path: Path) -> tuple[socket.socket, int]:
    """A listening socket at ``path``, in a directory only this process's user may write
    (made here when missing); the socket's inode."""
    parent = path.parent
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(parent, 0o755)
        st = os.lstat(parent)
    except OSError as exc:
        raise ConfigError(f"JOBFENCE_COMMAND_SOCKET: cannot make {parent}: "
                          f"{exc.strerror or exc}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ConfigError(
            f"JOBFENCE_COMMAND_SOCKET: {parent} must be a directory that only the worker's "
            f"user may write (it is mode {stat.filemode(st.st_mode)}, uid {st.st_uid})")
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ConfigError(f"JOBFENCE_COMMAND_SOCKET: {path} exists and is not a socket")
        os.unlink(path)  # a socket left by a worker before this one
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o666)  # noqa: S103 - the runner is another user; SO_PEERCRED says who
        listener.listen(1)
    except OSError as exc:
        listener.close()
        raise ConfigError(f"JOBFENCE_COMMAND_SOCKET: cannot listen on {path}: {exc}") from exc
    return listener, os.lstat(path).st_ino
