"""The Kubernetes control plane the tests and ``make cluster-up`` run, built from pinned Go
sources: etcd, kube-apiserver, kube-controller-manager, kubectl, and the node's
kube-scheduler and kubelet.

``go.mod``/``go.sum`` beside this file are a wrapper module whose only content is the pins:
``k8s.io/kubernetes`` cannot be built as a dependency as published (its ``go.mod`` replaces
every ``k8s.io/*`` staging module with a folder that is not in its module zip), so the
wrapper replaces each with its published ``v0.X.Y`` tag. ``generate`` writes that list from
the downloaded ``go.mod`` of the Kubernetes version — never by hand. ``build`` compiles each
binary that is missing from the cache, keyed by a hash of the wrapper module, the Go version
and the build flags (``~/.cache/jobfence/controlplane/<key>/bin``), and links it into
``build/bin`` of the work tree. Standard library only: ``make deploy`` runs it before any
virtualenv exists.

    python -m devtools.controlplane build [NAME ...]      # only what is missing
    python -m devtools.controlplane path NAME             # where a built binary is
    python -m devtools.controlplane generate [--kubernetes v1.35.4] [--etcd v3.6.5]
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools import REPO

HERE = Path(__file__).resolve().parent
GO_MOD, GO_SUM = HERE / "go.mod", HERE / "go.sum"
LINKS = REPO / "build" / "bin"

MODULE = "jobfence.dev/devtools/controlplane"
KUBERNETES = "v1.35.4"
"""The newest 1.35 release (the newest line KEDA 2.20 supports)."""
ETCD = "v3.6.5"
"""The etcd server version k8s.io/kubernetes at KUBERNETES requires itself, so that one
module graph builds all four."""

_MINOR = KUBERNETES.split(".")[1]
FLAGS = ("-trimpath", "-tags=selinux,notest",
         "-ldflags=-s -w"
         f" -X k8s.io/component-base/version.gitVersion={KUBERNETES}"
         f" -X k8s.io/component-base/version.gitMajor=1"
         f" -X k8s.io/component-base/version.gitMinor={_MINOR}")
"""``go build`` flags; with ``CGO_ENABLED=0``, static binaries. They are part of the key.
The version stamps are what the binaries report (a node's ``kubeletVersion``, ``kubectl
version``): without them, ``v0.0.0-master``."""


@dataclass(frozen=True)
class Component:
    name: str
    package: str
    what: str


COMPONENTS = (
    Component("etcd", "go.etcd.io/etcd/server/v3", "the API server's storage"),
    Component("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", "the API server"),
    Component("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager",
              "the Job, CronJob, garbage-collector and other controllers"),
    Component("kubectl", "k8s.io/kubernetes/cmd/kubectl", "the command line client"),
    Component("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler",
              "the scheduler (binds pods to the node)"),
    Component("kubelet", "k8s.io/kubernetes/cmd/kubelet",
              "the node's kubelet (runs pods through containerd)"),
)
NAMES = tuple(c.name for c in COMPONENTS)


class BuildError(RuntimeError):
    """Something a person must fix (no Go, a Go too old, a failed build): one line."""


def say(message: str) -> None:
    print(f"controlplane: {message}", flush=True)


def cache_root(what: str = "controlplane") -> Path:
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


def go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("Go is not installed, and etcd, kube-apiserver, "
                         "kube-controller-manager, kubectl, kube-scheduler and the kubelet "
                         "are built from source with it "
                         "(once, then cached): install Go >= " + required_go() +
                         " (https://go.dev/dl/) and run make again")
    return go


def required_go() -> str:
    match = re.search(r"^go (\S+)$", GO_MOD.read_text(), re.M)
    return match.group(1) if match else "1.25"


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])


def go_version(go: str) -> str:
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True,
                         env=go_env(), check=False)
    version = out.stdout.strip().removeprefix("go")
    if out.returncode != 0 or not version:
        raise BuildError(f"{go} does not answer `go env GOVERSION`: {out.stderr.strip()}")
    if _version_tuple(version) < _version_tuple(required_go()):
        raise BuildError(f"Go {version} is too old to build the control plane: it needs "
                         f"Go >= {required_go()} (https://go.dev/dl/)")
    return version


def run_go(go: str, *args: str, cwd: Path = HERE, env: dict[str, str] | None = None,
           capture: bool = False) -> str:
    out = subprocess.run([go, *args], cwd=cwd, env=env or go_env(), text=True,
                         capture_output=capture, check=False,
                         stdout=None if capture else sys.stderr)
    if out.returncode != 0:
        detail = (out.stderr or "").strip().splitlines()[-1:] if capture else []
        raise BuildError(f"`go {' '.join(args)}` failed (exit {out.returncode})"
                         + (f": {detail[0]}" if detail else ""))
    return out.stdout or ""


# -- the cache -------------------------------------------------------------------------------


def key(version: str) -> str:
    h = hashlib.sha256()
    for part in (GO_MOD.read_bytes(), GO_SUM.read_bytes(), version.encode(),
                 " ".join(FLAGS).encode(), f"{platform.system()}/{platform.machine()}".encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def bin_dir(version: str) -> Path:
    return cache_root() / key(version) / "bin"


def _recorded_dir() -> Path | None:
    """The bin directory ``build/bin`` links to, if it was built from this very wrapper
    module: a machine that has the binaries needs no Go to find them."""
    for name in NAMES:
        link = LINKS / name
        if link.is_symlink():
            directory = Path(os.readlink(link)).parent
            stamp = directory.parent / "key"
            if directory.is_relative_to(cache_root()) and stamp.exists() \
                    and stamp.read_text().strip() == _module_digest():
                return directory
            return None
    return None


def path(name: str) -> Path:
    """The built binary ``name`` for this wrapper module; BuildError if it is not built."""
    if name not in NAMES:
        raise BuildError(f"unknown control-plane component {name!r}: one of {', '.join(NAMES)}")
    candidates: list[Path] = []
    with contextlib.suppress(BuildError):
        candidates.append(bin_dir(go_version(go_binary())))
    recorded = _recorded_dir()
    if recorded is not None:
        candidates.append(recorded)
    for directory in candidates:
        if (directory / name).exists():
            return directory / name
    raise BuildError(f"{name} is not built for devtools/controlplane/go.mod: "
                     f"run `make controlplane`")


def _module_digest() -> str:
    return hashlib.sha256(GO_MOD.read_bytes() + b"\0" + GO_SUM.read_bytes()).hexdigest()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One build at a time per cache key (two make runs, two test processes)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _size(p: Path) -> str:
    return f"{p.stat().st_size / 1e6:.0f} MB"


def compile_one(go: str, component: Component, out: Path, env: dict[str, str]) -> Path:
    """``go build`` one component into ``out`` (atomically: a half-written binary is never
    there)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        target = Path(tmp) / component.name
        run_go(go, "build", *FLAGS, "-o", str(target), component.package, env=env)
        os.replace(target, out / component.name)
    return out / component.name


def build(names: Sequence[str] = NAMES, *, env: dict[str, str] | None = None,
          links: bool = True) -> dict[str, Path]:
    """Build each of ``names`` that is not in the cache yet; their paths. Prints each step
    with its time."""
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise BuildError(f"unknown control-plane component {unknown[0]!r}: "
                         f"one of {', '.join(NAMES)}")
    wanted = [c for c in COMPONENTS if c.name in names]
    try:
        go = go_binary()
    except BuildError:
        recorded = _recorded_dir()  # built before, from the same module: no Go needed now
        if recorded is not None and all((recorded / c.name).exists() for c in wanted):
            return {c.name: recorded / c.name for c in wanted}
        raise
    version = go_version(go)
    out = bin_dir(version)
    with _locked(out.parent):
        missing = [c for c in wanted if not (out / c.name).exists()]
        if missing:
            names_missing = ", ".join(c.name for c in missing)
            say(f"building {names_missing} from source with Go {version} "
                f"(pinned in devtools/controlplane/go.mod; cached in {out}).")
            say("a first build takes a long while: about 7 minutes of compiling on two "
                "cores (docs/BENCHMARKS.md), up to tens of minutes on a slower or busier "
                "machine or with the ~600 MB of modules still to download, and ~3 GB of Go's "
                "build cache; later builds reuse that cache, and nothing is rebuilt once "
                "cached")
            env = env or go_env()
            started = time.monotonic()
            run_go(go, "mod", "download", env=env)
            say(f"modules downloaded in {time.monotonic() - started:.0f} s")
            for c in missing:
                started = time.monotonic()
                say(f"building {c.name} ({c.what}) ...")
                built = compile_one(go, c, out, env)
                say(f"built {c.name} in {time.monotonic() - started:.0f} s ({_size(built)})")
            (out.parent / "built.json").write_text(json.dumps(
                {"go": version, "flags": FLAGS, "kubernetes": KUBERNETES, "etcd": ETCD},
                indent=2) + "\n")
        (out.parent / "key").write_text(_module_digest() + "\n")
    if links:
        link(out)
    return {c.name: out / c.name for c in wanted}


def link(directory: Path) -> None:
    """``build/bin/NAME`` → the cached binary, for people (``build/cluster/env`` puts
    build/bin first on PATH). Links only: no binary lives in the work tree."""
    for name in NAMES:
        if (directory / name).exists():
            link_binary(directory / name)


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


# -- generating the wrapper module -----------------------------------------------------------


def staging_version(kubernetes: str) -> str:
    """k8s.io/kubernetes v1.X.Y publishes its staging modules as v0.X.Y."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", kubernetes)
    if not match:
        raise BuildError(f"not a Kubernetes release version: {kubernetes!r} (e.g. v1.35.4)")
    return f"v0.{match.group(1)}.{match.group(2)}"


def generate(kubernetes: str = KUBERNETES, etcd: str = ETCD) -> None:
    """Write go.mod and go.sum: the go and godebug lines and one replace per staging module,
    all taken from the downloaded go.mod of k8s.io/kubernetes@``kubernetes``, then the four
    tools at their versions."""
    go = go_binary()
    go_version(go)
    staged = staging_version(kubernetes)
    env = {**go_env(), "GOFLAGS": "-mod=mod -buildvcs=false", "GOTOOLCHAIN": "local"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        info = json.loads(run_go(go, "mod", "download", "-json", f"k8s.io/kubernetes@{kubernetes}",
                                 cwd=work, env=env, capture=True))
        upstream = json.loads(run_go(go, "mod", "edit", "-json", info["GoMod"], cwd=work,
                                     env=env, capture=True))
        replaces = sorted(r["Old"]["Path"] for r in upstream.get("Replace") or []
                          if r["New"]["Path"].startswith("./staging/"))
        if not replaces:
            raise BuildError(f"k8s.io/kubernetes@{kubernetes}'s go.mod replaces no staging "
                             "module: the wrapper's premise no longer holds, look at it again")
        godebug = [f"godebug {d['Key']}={d['Value']}" for d in upstream.get("GoDebug") or []]
        (work / "go.mod").write_text("\n".join([
            "// The control plane's pinned sources (devtools/controlplane/__init__.py). Written",
            "// by `python -m devtools.controlplane generate`: do not edit by hand.",
            f"module {MODULE}", "", f"go {upstream['Go']}", "", *godebug, ""]) + "\n")
        run_go(go, "mod", "edit", *(f"-replace={p}={p}@{staged}" for p in replaces),
               cwd=work, env=env)
        tools = [f"{c.package}@{etcd if c.name == 'etcd' else kubernetes}"
                 for c in COMPONENTS]
        run_go(go, "get", "-tool", *tools, cwd=work, env=env)
        run_go(go, "mod", "tidy", cwd=work, env=env)
        shutil.copyfile(work / "go.mod", GO_MOD)
        shutil.copyfile(work / "go.sum", GO_SUM)
    say(f"wrote {GO_MOD.relative_to(REPO)} and go.sum: Kubernetes {kubernetes} "
        f"({len(replaces)} staging modules at {staged}), etcd {etcd}")


# -- the command line -------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.controlplane",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build what is missing from the cache")
    b.add_argument("names", nargs="*", default=list(NAMES), metavar="NAME")
    p = sub.add_parser("path", help="print where a built binary is")
    p.add_argument("name")
    g = sub.add_parser("generate", help="write go.mod and go.sum from the upstream go.mod")
    g.add_argument("--kubernetes", default=KUBERNETES)
    g.add_argument("--etcd", default=ETCD)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(args.names)
        elif args.command == "path":
            print(path(args.name))
        else:
            generate(args.kubernetes, args.etcd)
    except BuildError as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 2
    return 0
