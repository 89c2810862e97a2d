"""The memory cgroup a job's command runs in (the worker's or the command sidecar's
container, in a pod): its limit, and how many processes the kernel's out-of-memory killer
has killed in it — so that a command killed by SIGKILL while the count rose is said to
have run out of memory, not merely to have been killed.

cgroup v1 (``memory.oom_control``'s ``oom_kill``, ``memory.limit_in_bytes``) and v2
(``memory.events``' ``oom_kill``, ``memory.max``). Inside a container the cgroup
filesystem shows the container's own cgroup at its root; on a machine of its own, the
process's cgroup is found from ``/proc/self/cgroup``. Anything unreadable is None: never an
error of the job.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 60
"""A v1 limit at or above this is no limit (the kernel's "unlimited" is near 2^63)."""


@dataclass(frozen=True, slots=True)
class MemoryCgroup:
    path: Path
    v2: bool

    def oom_kills(self) -> int | None:
        """Processes the OOM killer killed in this cgroup so far."""
        name = "memory.events" if self.v2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / name).read_bytes().decode("ascii", "replace").splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return None

    def limit_bytes(self) -> int | None:
        """Its memory limit; None when it has none (or it cannot be read)."""
        name = "memory.max" if self.v2 else "memory.limit_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            text = (self.path / name).read_bytes().decode("ascii", "replace").strip()
            if text != "max" and (limit := int(text)) < UNLIMITED:
                return limit
        return None


def own(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = ROOT) -> MemoryCgroup | None:
    """This process's memory cgroup, or None where there is none to read."""
    try:
        lines = proc_cgroup.read_bytes().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = ([*line.split(":", 2), "", ""])[:3]
        if "memory" in controllers.split(","):
            return _found(root / "memory", path, v2=False)
    for line in lines:
        if line.startswith("0::"):
            return _found(root, line[3:], v2=True)
    return None


@functools.cache
def this_process() -> MemoryCgroup | None:
    """``own()``, found once per process (a worker does not change cgroups between jobs)."""
    return own()


def _found(base: Path, path: str, *, v2: bool) -> MemoryCgroup | None:
    probe = "memory.events" if v2 else "memory.oom_control"
    rel = path.strip().lstrip("/")
    for candidate in (base / rel if rel else base, base):  # a container sees its own at base
        with contextlib.suppress(OSError, ValueError):
            if (candidate / probe).is_file():
                return MemoryCgroup(candidate, v2)
    return None
