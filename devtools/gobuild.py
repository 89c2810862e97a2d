"""One builder for the pinned Go tools: the control plane (devtools.controlplane), the KEDA
operator (devtools.keda) and the OpenTelemetry Collector (devtools.otelcol).

Each tool is a folder holding a Go module whose only content is its pins (``go.mod``,
``go.sum``, and for the collector the sources its builder writes), described by a
``GoTool``. ``build`` compiles each of its binaries that is missing from the cache, keyed by
a hash of that module, the Go version, the build flags and the platform
(``~/.cache/jobfence/<label>/<key>/bin``, ``JOBFENCE_<LABEL>_CACHE`` moves it), and links
it into ``build/bin`` of the work tree; the cache directory's ``key`` stamp (a digest of the
module alone) lets a machine without Go find binaries built before from the same module.
Standard library only: ``make deploy`` runs it before any virtualenv exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devtools import REPO

LINKS = REPO / "build" / "bin"
"""Where the built binaries are linked for people (links only: no binary lives in the work
tree)."""


class BuildError(RuntimeError):
    """Something a person must fix (no Go, a Go too old, a failed build): one line."""


def cache_root(what: str) -> Path:
    """Where the Go binaries of ``what`` are cached: ``JOBFENCE_<WHAT>_CACHE``, else
    ``$XDG_CACHE_HOME/jobfence/<what>`` (``~/.cache`` by default), outside the work tree."""
    base = os.environ.get(f"JOBFENCE_{what.upper()}_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "jobfence" / what


# -- Go --------------------------------------------------------------------------------------


def go_env() -> dict[str, str]:
    """The environment every go command runs in: static binaries, this module only, its
    go.sum as the truth (``-mod=readonly``), never a newer toolchain fetched behind our back."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOFLAGS", "GOWORK")}
    env.update(CGO_ENABLED="0", GOWORK="off", GOFLAGS="-mod=readonly -buildvcs=false",
               GOTOOLCHAIN="local")
    return env


def go_binary(what: str, at_least: str) -> str:
    """The ``go`` on PATH; BuildError naming ``what`` needs it when there is none."""
    go = shutil.which("go")
    if go is None:
        raise BuildError(f"Go is not installed, and {what} is built from source with it "
                         f"(once, then cached): install Go >= {at_least} (https://go.dev/dl/) "
                         "and run make again")
    return go


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])


def go_version(go: str, what: str, at_least: str) -> str:
    """``go``'s version (``1.26.1``); BuildError when it is older than ``at_least``."""
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True,
                         env=go_env(), check=False)
    version = out.stdout.strip().removeprefix("go")
    if out.returncode != 0 or not version:
        raise BuildError(f"{go} does not answer `go env GOVERSION`: {out.stderr.strip()}")
    if _version_tuple(version) < _version_tuple(at_least):
        raise BuildError(f"Go {version} is too old to build {what}: it needs "
                         f"Go >= {at_least} (https://go.dev/dl/)")
    return version


def run_go(go: str, *args: str, cwd: Path, env: dict[str, str] | None = None,
           capture: bool = False, nice: bool = False) -> str:
    """``go ARGS`` in ``cwd`` (its output to stderr unless captured; at ``nice -n 10`` when
    asked and nice is there); BuildError when it fails."""
    argv = [go, *args]
    niceness = shutil.which("nice") if nice else None
    if niceness:
        argv = [niceness, "-n", "10", *argv]
    out = subprocess.run(argv, cwd=cwd, env=env or go_env(), text=True,
                         capture_output=capture, check=False,
                         stdout=None if capture else sys.stderr)
    if out.returncode != 0:
        detail = (out.stderr or "").strip().splitlines()[-1:] if capture else []
        raise BuildError(f"`go {' '.join(args)}` failed (exit {out.returncode})"
                         + (f": {detail[0]}" if detail else ""))
    return out.stdout or ""


# -- the cache -------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One build at a time per cache key (two make runs, two test processes)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _size(p: Path) -> str:
    return f"{p.stat().st_size / 1e6:.0f} MB"


def link_binary(target: Path) -> None:
    """``build/bin/<its name>`` → ``target``, replaced atomically (links only)."""
    LINKS.mkdir(parents=True, exist_ok=True)
    dest = LINKS / target.name
    if dest.is_symlink() and os.readlink(dest) == str(target):
        return
    tmp = LINKS / f".{target.name}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(target)
    os.replace(tmp, dest)


# -- one pinned tool -------------------------------------------------------------------------


@dataclass(frozen=True)
class Binary:
    """One program of a tool: its name, the Go package it is built from, what it is."""

    name: str
    package: str
    what: str


@dataclass(frozen=True)
class GoTool:
    """A Go tool built from a pinned module and cached outside the work tree."""

    label: str
    """The cache's folder and the messages' prefix (``controlplane``)."""
    title: str
    """What is built, in a sentence (``the control plane``)."""
    module: Path
    """The folder of its Go module."""
    binaries: tuple[Binary, ...]
    flags: tuple[str, ...]
    """``go build`` flags; with ``CGO_ENABLED=0``, static binaries. Part of the key."""
    first_build: str
    """Said before a first build: how long it takes."""
    sources: tuple[str, ...] = ("go.mod", "go.sum")
    """The files of ``module`` whose bytes are its digest (and part of the key)."""
    built: Mapping[str, str] = field(default_factory=dict)
    """What ``built.json`` records besides the Go version and the flags (the pins)."""
    nice: bool = False
    """Compile at ``nice -n 10`` (the machine is shared with whatever else runs)."""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.binaries)

    def say(self, message: str) -> None:
        print(f"{self.label}: {message}", flush=True)

    def required_go(self) -> str:
        """The Go version the module's ``go`` line asks for."""
        match = re.search(r"^go (\S+)$", (self.module / "go.mod").read_text(), re.M)
        if not match:
            raise BuildError(f"{self.module.relative_to(REPO)}/go.mod has no go line")
        return match.group(1)

    def toolchain(self) -> tuple[str, str]:
        """``go`` and its version; BuildError when there is none, or one too old."""
        at_least = self.required_go()
        go = go_binary(self.title, at_least)
        return go, go_version(go, self.title, at_least)

    def _source_bytes(self) -> list[bytes]:
        return [(self.module / name).read_bytes() for name in self.sources]

    def module_digest(self) -> str:
        """The digest of the module alone (the ``key`` stamp beside a cached build)."""
        return hashlib.sha256(b"\0".join(self._source_bytes())).hexdigest()

    def key(self, version: str) -> str:
        """The cache key: the module's files, the Go version, the flags, the platform."""
        h = hashlib.sha256()
        for part in (*self._source_bytes(), version.encode(), " ".join(self.flags).encode(),
                     f"{platform.system()}/{platform.machine()}".encode()):
            h.update(part)
            h.update(b"\0")
        return h.hexdigest()[:16]

    def bin_dir(self, version: str) -> Path:
        return cache_root(self.label) / self.key(version) / "bin"

    def recorded(self) -> Path | None:
        """The bin directory ``build/bin`` links to, if it was built from this very module:
        a machine that has the binaries needs no Go to find them."""
        for name in self.names:
            link = LINKS / name
            if link.is_symlink():
                directory = Path(os.readlink(link)).parent
                stamp = directory.parent / "key"
                if directory.is_relative_to(cache_root(self.label)) and stamp.exists() \
                        and stamp.read_text().strip() == self.module_digest():
                    return directory
                return None
        return None

    def _check(self, names: Sequence[str]) -> None:
        unknown = [n for n in names if n not in self.names]
        if unknown:
            raise BuildError(f"unknown {self.label} binary {unknown[0]!r}: "
                             f"one of {', '.join(self.names)}")

    def path(self, name: str) -> Path:
        """The built binary ``name`` for this module; BuildError if it is not built."""
        self._check([name])
        candidates: list[Path] = []
        with contextlib.suppress(BuildError):
            candidates.append(self.bin_dir(self.toolchain()[1]))
        recorded = self.recorded()
        if recorded is not None:
            candidates.append(recorded)
        for directory in candidates:
            if (directory / name).exists():
                return directory / name
        raise BuildError(f"{name} is not built for {self.module.relative_to(REPO)}/go.mod: "
                         f"run `make {self.label}`")

    def build(self, names: Sequence[str] | None = None, *, env: dict[str, str] | None = None,
              links: bool = True) -> dict[str, Path]:
        """Build each of ``names`` (all by default) that is not in the cache yet; their
        paths. Prints each step with its time."""
        self._check(names or ())
        wanted = [b for b in self.binaries if names is None or b.name in names]
        try:
            go, version = self.toolchain()
        except BuildError:
            recorded = self.recorded()  # built before, from the same module: no Go needed
            if recorded is not None and all((recorded / b.name).exists() for b in wanted):
                return {b.name: recorded / b.name for b in wanted}
            raise
        out = self.bin_dir(version)
        with _locked(out.parent):
            missing = [b for b in wanted if not (out / b.name).exists()]
            if missing:
                self.say(f"building {', '.join(b.name for b in missing)} from source with "
                         f"Go {version} (pinned in {self.module.relative_to(REPO)}/go.mod; "
                         f"cached in {out}).")
                self.say(self.first_build)
                env = env or go_env()
                started = time.monotonic()
                run_go(go, "mod", "download", cwd=self.module, env=env)
                self.say(f"modules downloaded in {time.monotonic() - started:.0f} s")
                for b in missing:
                    started = time.monotonic()
                    self.say(f"building {b.name} ({b.what}) ...")
                    built = self.compile_one(go, b, out, env)
                    self.say(f"built {b.name} in {time.monotonic() - started:.0f} s "
                             f"({_size(built)})")
                (out.parent / "built.json").write_text(json.dumps(
                    {"go": version, "flags": self.flags, **self.built}, indent=2) + "\n")
            (out.parent / "key").write_text(self.module_digest() + "\n")
        if links:
            for name in self.names:
                if (out / name).exists():
                    link_binary(out / name)
        return {b.name: out / b.name for b in wanted}

    def compile_one(self, go: str, binary: Binary, out: Path, env: dict[str, str]) -> Path:
        """``go build`` one binary into ``out`` (atomically: a half-written binary is never
        there), at ``nice -n 10`` when the tool asks."""
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            target = Path(tmp) / binary.name
            run_go(go, "build", *self.flags, "-o", str(target), binary.package,
                   cwd=self.module, env=env, nice=self.nice)
            os.replace(target, out / binary.name)
        return out / binary.name
