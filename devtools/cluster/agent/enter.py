"""Start one container's process the way a container runtime would, as far as this machine
allows without images: in mount, PID and UTS namespaces of its own, with the pod's volumes
mounted where the container asks for them (the ServiceAccount token at the path the
Kubernetes client's in-cluster configuration reads, the emptyDirs the pod's containers
share), a fresh /proc, the root filesystem read-only when the container says so, then as
its ``runAsUser``/``runAsGroup``.

    python -m devtools.cluster.agent.enter SPEC.json

The node agent runs this as root. It forks the container's init (PID 1 of the new PID
namespace), which sets up the mounts, drops to the container's user and forks the command;
like the image's tini, the init passes on the signals it gets and reaps orphans, and exits
with the command's status (128 + N when a signal N ended it). When the init exits, the
kernel kills whatever is left in its PID namespace, as it does when a container's PID 1
exits. This process passes signals to the init and exits with its status; if the agent
dies, it dies (and so does the container: both hold ``PR_SET_PDEATHSIG``).

A directory that does not exist on this machine (``/var/run/secrets/...``, ``/etc/jobfence``)
is made inside the container's own view: an overlay on its nearest existing ancestor, whose
upper layer is a tmpfs only this mount namespace sees. Nothing is created on the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWPID = 0x00020000, 0x04000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGWINCH)

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    _check(libc.mount(source.encode() if source else None, target.encode(),
                      fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                      data.encode() if data else None), f"mount {target}")


def prctl(option: int, arg: int) -> None:
    _check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), "prctl")


def status_code(status: int) -> int:
    """A wait status as a container runtime reports it: the exit code, or 128 + signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def forward_to(pid: int) -> None:
    def handler(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in FORWARDED:
        signal.signal(sig, handler)


class Mounts:
    """The container's view of the filesystem, built inside its mount namespace."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.overlaid: list[str] = []
        self.covered: list[str] = []
        self.rebased: list[str] = []

    def mountpoint(self, target: str) -> str:
        """``target`` as a directory that exists in this view (made in an overlay when the
        host has no such directory)."""
        real = os.path.realpath(target)
        if os.path.isdir(real):
            return real
        ancestor = real
        while not os.path.isdir(ancestor):
            ancestor = os.path.dirname(ancestor)
        if ancestor == "/":  # made in the root of our own (see rebase)
            os.makedirs(real)
            return real
        if ancestor not in self.overlaid:
            layer = self.scratch / f"overlay-{len(self.overlaid)}"
            (layer / "upper").mkdir(parents=True)
            (layer / "work").mkdir()
            mount("overlay", ancestor, "overlay", 0,
                  f"lowerdir={ancestor},upperdir={layer / 'upper'},workdir={layer / 'work'}")
            self.overlaid.append(ancestor)
        os.makedirs(real, exist_ok=True)
        return real

    def bind(self, source: str, target: str, read_only: bool) -> None:
        where = self.mountpoint(target)
        mount(source, where, None, MS_BIND | MS_REC)  # a /proc/self/fd path: see init
        if read_only:
            mount(None, where, None, MS_BIND | MS_REMOUNT | MS_RDONLY)

    def expose(self, held: str, path: str, uid: int, gids: set[int]) -> None:
        """Make ``path`` (the Python installation and the environment the pod runs from,
        as an image would contain them) reachable by the container's user, and nothing
        beside it: a directory above it that the user may not enter (``/root``, 0700)
        is covered by an empty tmpfs in which only ``path`` is mounted, read-only."""
        parts = Path(path).parts
        for i in range(2, len(parts) + 1):
            ancestor = str(Path(*parts[:i]))
            if ancestor in self.covered:
                break
            if not _may_enter(os.stat(ancestor), uid, gids):
                mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
                self.covered.append(ancestor)
                break
        else:
            return  # reachable as it is
        os.makedirs(path, exist_ok=True)
        mount(held, path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)

    def reexpose(self, held: str, path: str) -> None:
        """``path`` again, read-only, where a volume mounted above it (an emptyDir on
        ``/tmp`` over an environment that lives in ``/tmp``) hid it: as an image's own files
        stay where they are, whatever volume the pod mounts beside them. Its mount point is
        made, owned by root, inside that volume."""
        os.makedirs(path, exist_ok=True)
        mount(held, path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)

    def rebase(self) -> None:
        """A root of the container's own, for a mount point at the top level (``/shared``):
        a tmpfs into which every top-level entry of the host's root is bound, then
        ``chroot``. Everything stays where it was; new top-level directories can be made."""
        root = self.scratch / "root"
        root.mkdir()
        mount("tmpfs", str(root), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        for entry in os.scandir("/"):
            target = root / entry.name
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), target)
            elif entry.is_dir():
                target.mkdir()
                mount(entry.path, str(target), None, MS_BIND | MS_REC)
                if entry.name not in ("proc", "sys", "dev"):
                    self.rebased.append("/" + entry.name)
            else:
                target.touch()
                mount(entry.path, str(target), None, MS_BIND)
        os.chroot(root)
        os.chdir("/")

    def seal(self) -> None:
        """readOnlyRootFilesystem: the root and what was made for mount points become
        read-only; the volumes stay as the container mounted them."""
        mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        for where in [*self.rebased, *self.overlaid, *self.covered]:
            try:
                mount(None, where, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
            except OSError as exc:
                # Hidden since by a volume mounted above it (an emptyDir on /tmp over a
                # covered /tmp/x, where the checkout is in a folder only root may enter):
                # its path is now a plain directory of the volume, and nothing of it is
                # left to seal.
                if exc.errno != errno.EINVAL or os.path.ismount(where):
                    raise


def _top_level_missing(target: str) -> bool:
    """Whether making ``target`` takes a new directory directly under /."""
    real = os.path.realpath(target)
    return not os.path.exists("/" + Path(real).parts[1]) if len(Path(real).parts) > 1 \
        else False


def _may_enter(st: os.stat_result, uid: int, gids: set[int]) -> bool:
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid in gids:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def init(spec: dict[str, Any]) -> int:
    """PID 1 of the container: mounts, user, then the command; returns its status."""
    _check(libc.unshare(CLONE_NEWNS), "unshare")  # this process's own view, not enter's
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing of ours propagates to the host
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    hostname = spec["hostname"].encode()
    _check(libc.sethostname(hostname, len(hostname)), "sethostname")
    os.makedirs(spec["scratch"], exist_ok=True)
    mount("tmpfs", spec["scratch"], "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=16m")
    # Every source, and the scratch space, held open before the first mount: a volume
    # mounted on /tmp must not hide the agent's own directories when they live under /tmp.
    # /proc/self/fd/N reaches the directory itself, whatever now covers its path.
    held = {p: os.open(p, os.O_PATH) for p in
            [*(m["source"] for m in spec["mounts"]), *spec.get("expose", [])]}
    mounts = Mounts(Path(f"/proc/self/fd/{os.open(spec['scratch'], os.O_PATH)}"))
    gids = {spec["gid"], *spec["groups"]}
    if any(_top_level_missing(m["target"]) for m in spec["mounts"]):
        mounts.rebase()
    for path in sorted(spec.get("expose", []), key=len):
        mounts.expose(f"/proc/self/fd/{held[path]}", path, spec["uid"], gids)
    for m in sorted(spec["mounts"], key=lambda m: m["target"].count("/")):
        mounts.bind(f"/proc/self/fd/{held[m['source']]}", m["target"], m["readOnly"])
    for path in sorted(spec.get("expose", []), key=len):
        if any(path.startswith(m["target"].rstrip("/") + "/") for m in spec["mounts"]):
            mounts.reexpose(f"/proc/self/fd/{held[path]}", path)
    for fd in held.values():
        os.close(fd)
    if spec.get("readOnlyRoot"):
        mounts.seal()
    env: dict[str, str] = spec["env"]
    argv: list[str] = spec["argv"]
    os.setgroups(spec["groups"])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
    if spec.get("noNewPrivileges"):
        prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid: a credential change clears it
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        print(f"node agent: working directory {spec['cwd']}: {exc.strerror}", file=sys.stderr)
        return 128
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", ""))
    if program is None:
        print(f'node agent: exec: "{argv[0]}": executable file not found in $PATH',
              file=sys.stderr)
        return 127
    child = os.fork()
    if child == 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execve(program, argv, env)  # noqa: S606 (a container runs its argv as given)
        except OSError as exc:
            print(f"node agent: exec {program}: {exc.strerror}", file=sys.stderr)
        os._exit(127)
    forward_to(child)
    while True:  # reap everything; the command's own end is the container's
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            return status_code(status)


def main(path: str) -> int:
    spec = json.loads(Path(path).read_text())
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if spec.get("agentPid") and os.getppid() != spec["agentPid"]:
        return 137  # the agent died before we could follow it
    _check(libc.unshare(CLONE_NEWPID | CLONE_NEWUTS), "unshare")  # for the child: PID 1
    pid = os.fork()
    if pid == 0:
        try:
            code = init(spec)
        except Exception as exc:
            print(f"node agent: cannot start the container: {exc}", file=sys.stderr)
            code = 128
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    forward_to(pid)
    Path(spec["pidFile"]).write_text(f"{pid}\n")
    while True:
        reaped, status = os.waitpid(pid, 0)
        if reaped == pid:
            return status_code(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
