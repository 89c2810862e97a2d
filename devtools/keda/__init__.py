"""The KEDA operator the tests and ``make cluster-up`` run, built from its pinned Go sources
(``github.com/kedacore/keda/v2``), the same way as the control plane (devtools.controlplane).

``go.mod``/``go.sum`` beside this file are a wrapper module whose only content is the pins:
KEDA's own ``go.mod`` pins Kubernetes, controller-runtime and Prometheus libraries with a
``replace`` block, and a ``replace`` binds only the main module — so the wrapper carries the
same block, copied by ``generate`` from the downloaded ``go.mod`` of the KEDA version, never
by hand; then ``go get -tool .../cmd/operator``. ``build`` compiles the operator when it is
missing from the cache, keyed by a hash of the wrapper module, the Go version and the build
flags (``~/.cache/jobfence/keda/<key>/bin/keda-operator``), and links it into ``build/bin``.
The operator links every scaler KEDA has (every cloud's SDK): its first build is the
longest of all. Standard library only.

    python -m devtools.keda build           # only when missing
    python -m devtools.keda path            # where the built operator is
    python -m devtools.keda source          # where KEDA's module (CRDs, RBAC) is
    python -m devtools.keda generate [--keda v2.20.2]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from devtools import REPO, controlplane
from devtools.controlplane import BuildError, go_binary, go_env, run_go

HERE = Path(__file__).resolve().parent
GO_MOD, GO_SUM = HERE / "go.mod", HERE / "go.sum"
LINKS = controlplane.LINKS

MODULE = "jobfence.dev/devtools/keda"
KEDA_MODULE = "github.com/kedacore/keda/v2"
KEDA = "v2.20.2"
"""The newest 2.20 release the Go module proxy serves (2.20.0 and 2.20.1 reject an explicit
``strategy: default``; the pools leave it out either way)."""
PACKAGE = f"{KEDA_MODULE}/cmd/operator"
NAME = "keda-operator"

FLAGS = ("-trimpath",
         f"-ldflags=-s -w -X={KEDA_MODULE}/version.Version={KEDA.removeprefix('v')}")
"""``go build`` flags (as KEDA's Makefile sets the version); with ``CGO_ENABLED=0``, a static
binary. They are part of the key."""


def say(message: str) -> None:
    print(f"keda: {message}", flush=True)


def cache_root() -> Path:
    return controlplane.cache_root("keda")


def required_go() -> str:
    match = re.search(r"^go (\S+)$", GO_MOD.read_text(), re.M)
    return match.group(1) if match else "1.26"


def go_version(go: str) -> str:
    out = run_go(go, "env", "GOVERSION", capture=True)
    version = out.strip().removeprefix("go")
    if controlplane._version_tuple(version) < controlplane._version_tuple(required_go()):
        raise BuildError(f"Go {version} is too old to build the KEDA operator: it needs "
                         f"Go >= {required_go()} (https://go.dev/dl/)")
    return version


def _module_digest() -> str:
    return hashlib.sha256(GO_MOD.read_bytes() + b"\0" + GO_SUM.read_bytes()).hexdigest()


def key(version: str) -> str:
    h = hashlib.sha256()
    for part in (GO_MOD.read_bytes(), GO_SUM.read_bytes(), version.encode(),
                 " ".join(FLAGS).encode(), f"{platform.system()}/{platform.machine()}".encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def bin_dir(version: str) -> Path:
    return cache_root() / key(version) / "bin"


def _recorded() -> Path | None:
    """The binary ``build/bin/keda-operator`` links to, if it was built from this very
    wrapper module: a machine that has it needs no Go to find it."""
    link = LINKS / NAME
    if not link.is_symlink():
        return None
    target = Path(os.readlink(link))
    stamp = target.parent.parent / "key"
    if target.is_relative_to(cache_root()) and target.exists() and stamp.exists() \
            and stamp.read_text().strip() == _module_digest():
        return target
    return None


def path() -> Path:
    """The built operator for this wrapper module; BuildError if it is not built."""
    with contextlib.suppress(BuildError):
        built = bin_dir(go_version(go_binary())) / NAME
        if built.exists():
            return built
    recorded = _recorded()
    if recorded is not None:
        return recorded
    raise BuildError("the KEDA operator is not built for devtools/keda/go.mod: run `make keda`")


def build(*, env: dict[str, str] | None = None, links: bool = True) -> Path:
    """Build the operator if it is not in the cache yet; its path. Prints each step with
    its time."""
    try:
        go = go_binary()
    except BuildError:
        recorded = _recorded()
        if recorded is not None:
            return recorded
        raise
    version = go_version(go)
    out = bin_dir(version)
    with controlplane._locked(out.parent):
        if not (out / NAME).exists():
            say(f"building the KEDA operator {KEDA} from source with Go {version} (pinned in "
                f"devtools/keda/go.mod; cached in {out}).")
            say("this first build takes long: it links every scaler KEDA has (every cloud's "
                "SDK) — 8 to 18 minutes of compiling on two cores (docs/BENCHMARKS.md), "
                "more on a busier machine or with its modules still to download, and "
                "~2 GB of Go's build cache; nothing is rebuilt once cached")
            env = env or go_env()
            started = time.monotonic()
            run_go(go, "mod", "download", cwd=HERE, env=env)
            say(f"modules downloaded in {time.monotonic() - started:.0f} s")
            started = time.monotonic()
            say(f"building {NAME} ({PACKAGE}) ...")
            built = compile_operator(go, out, env)
            say(f"built {NAME} in {time.monotonic() - started:.0f} s "
                f"({built.stat().st_size / 1e6:.0f} MB)")
            (out.parent / "built.json").write_text(json.dumps(
                {"go": version, "flags": FLAGS, "keda": KEDA}, indent=2) + "\n")
        (out.parent / "key").write_text(_module_digest() + "\n")
    if links:
        controlplane.link_binary(out / NAME)
    return out / NAME


def compile_operator(go: str, out: Path, env: dict[str, str]) -> Path:
    """``go build`` the operator into ``out`` (atomically), at a lower CPU priority: the
    machine is shared with whatever else runs."""
    out.mkdir(parents=True, exist_ok=True)
    nice = shutil.which("nice")
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        target = Path(tmp) / NAME
        argv = [go, "build", *FLAGS, "-o", str(target), PACKAGE]
        if nice:
            argv = [nice, "-n", "10", *argv]
        _run(argv, env)
        os.replace(target, out / NAME)
    return out / NAME


def _run(argv: list[str], env: dict[str, str]) -> None:
    import subprocess

    done = subprocess.run(argv, cwd=HERE, env=env, stdout=sys.stderr, check=False)
    if done.returncode != 0:
        raise BuildError(f"`{' '.join(argv[-4:])}` failed (exit {done.returncode})")


def source() -> Path:
    """KEDA's module at the pinned version (its CRDs and RBAC): downloaded through the
    wrapper module, so go.sum verifies it."""
    go = go_binary()
    out = run_go(go, "mod", "download", "-json", KEDA_MODULE, cwd=HERE, capture=True)
    info = json.loads(out)
    if "Dir" not in info:
        raise BuildError(f"could not download {KEDA_MODULE}: {info.get('Error')}")
    return Path(info["Dir"])


# -- generating the wrapper module -----------------------------------------------------------


def generate(keda: str = KEDA) -> None:
    """Write go.mod and go.sum: the go line and every ``replace`` of the downloaded go.mod of
    KEDA@``keda``, then the operator as a tool at that version."""
    go = go_binary()
    env = {**go_env(), "GOFLAGS": "-mod=mod -buildvcs=false"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        info = json.loads(run_go(go, "mod", "download", "-json", f"{KEDA_MODULE}@{keda}",
                                 cwd=work, env=env, capture=True))
        upstream = json.loads(run_go(go, "mod", "edit", "-json", info["GoMod"], cwd=work,
                                     env=env, capture=True))
        replaces = upstream.get("Replace") or []
        local = [r["Old"]["Path"] for r in replaces if not r["New"].get("Version")]
        if local:
            raise BuildError(f"KEDA {keda}'s go.mod replaces {local[0]} with a folder: the "
                             "wrapper cannot carry that; look at it again")
        godebug = [f"godebug {d['Key']}={d['Value']}" for d in upstream.get("GoDebug") or []]
        (work / "go.mod").write_text("\n".join([
            "// The KEDA operator's pinned sources (devtools/keda/__init__.py). Written by",
            "// `python -m devtools.keda generate`: do not edit by hand.",
            f"module {MODULE}", "", f"go {upstream['Go']}", "", *godebug, ""]) + "\n")
        run_go(go, "mod", "edit", *(
            f"-replace={r['Old']['Path']}={r['New']['Path']}@{r['New']['Version']}"
            for r in replaces), cwd=work, env=env)
        run_go(go, "get", "-tool", f"{PACKAGE}@{keda}", cwd=work, env=env)
        run_go(go, "mod", "tidy", cwd=work, env=env)
        shutil.copyfile(work / "go.mod", GO_MOD)
        shutil.copyfile(work / "go.sum", GO_SUM)
    say(f"wrote {GO_MOD.relative_to(REPO)} and go.sum: KEDA {keda} with its "
        f"{len(replaces)} replaces")


def main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.keda",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the operator if it is missing from the cache")
    sub.add_parser("path", help="print where the built operator is")
    sub.add_parser("source", help="print where KEDA's module (CRDs, RBAC) is")
    g = sub.add_parser("generate", help="write go.mod and go.sum from KEDA's go.mod")
    g.add_argument("--keda", default=KEDA)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build()
        elif args.command == "path":
            print(path())
        elif args.command == "source":
            print(source())
        else:
            generate(args.keda)
    except BuildError as exc:
        print(f"keda: {exc}", file=sys.stderr)
        return 2
    return 0
