"""The KEDA operator the tests and ``make cluster-up`` run, built from its pinned Go sources
(``github.com/kedacore/keda/v2``), the same way as the control plane (devtools.controlplane).

``go.mod``/``go.sum`` beside this file are a wrapper module whose only content is the pins:
KEDA's own ``go.mod`` pins Kubernetes, controller-runtime and Prometheus libraries with a
``replace`` block, and a ``replace`` binds only the main module — so the wrapper carries the
same block, copied by ``generate`` from the downloaded ``go.mod`` of the KEDA version, never
by hand; then ``go get -tool .../cmd/operator``. ``build`` compiles the operator when it is
missing from the cache, keyed by a hash of the wrapper module, the Go version and the build
flags (``~/.cache/jobfence/keda/<key>/bin/keda-operator``), and links it into ``build/bin``
(devtools.gobuild, the builder of every pinned Go tool). The operator links every scaler
KEDA has (every cloud's SDK): its first build is the longest of all. Standard library only.

    python -m devtools.keda build           # only when missing
    python -m devtools.keda path            # where the built operator is
    python -m devtools.keda source          # where KEDA's module (CRDs, RBAC) is
    python -m devtools.keda generate [--keda v2.20.2]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from devtools import REPO
from devtools.gobuild import Binary, BuildError, GoTool, go_env, run_go

HERE = Path(__file__).resolve().parent
GO_MOD, GO_SUM = HERE / "go.mod", HERE / "go.sum"

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

OPERATOR = Binary(NAME, PACKAGE, f"the KEDA operator {KEDA}")
TOOL = GoTool(
    label="keda", title="the KEDA operator", module=HERE, binaries=(OPERATOR,),
    flags=FLAGS, built={"keda": KEDA}, nice=True,
    first_build="this first build takes long: it links every scaler KEDA has (every cloud's "
    "SDK) — 8 to 18 minutes of compiling on two cores (docs/BENCHMARKS.md), "
    "more on a busier machine or with its modules still to download, and "
    "~2 GB of Go's build cache; nothing is rebuilt once cached")


def path() -> Path:
    """The built operator for this wrapper module; BuildError if it is not built."""
    return TOOL.path(NAME)


def build(*, env: dict[str, str] | None = None, links: bool = True) -> Path:
    """Build the operator if it is not in the cache yet; its path. Prints each step with
    its time."""
    return TOOL.build(env=env, links=links)[NAME]


def source() -> Path:
    """KEDA's module at the pinned version (its CRDs and RBAC): downloaded through the
    wrapper module, so go.sum verifies it."""
    go, _ = TOOL.toolchain()
    out = run_go(go, "mod", "download", "-json", KEDA_MODULE, cwd=HERE, capture=True)
    info = json.loads(out)
    if "Dir" not in info:
        raise BuildError(f"could not download {KEDA_MODULE}: {info.get('Error')}")
    return Path(info["Dir"])


# -- generating the wrapper module -----------------------------------------------------------


def generate(keda: str = KEDA) -> None:
    """Write go.mod and go.sum: the go line and every ``replace`` of the downloaded go.mod of
    KEDA@``keda``, then the operator as a tool at that version."""
    go, _ = TOOL.toolchain()
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
    TOOL.say(f"wrote {GO_MOD.relative_to(REPO)} and go.sum: KEDA {keda} with its "
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
        print(f"{TOOL.label}: {exc}", file=sys.stderr)
        return 2
    return 0
