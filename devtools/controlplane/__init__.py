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
``build/bin`` of the work tree (devtools.gobuild, the builder of every pinned Go tool).
Standard library only: ``make deploy`` runs it before any virtualenv exists.

    python -m devtools.controlplane build [NAME ...]      # only what is missing
    python -m devtools.controlplane path NAME             # where a built binary is
    python -m devtools.controlplane generate [--kubernetes v1.35.4] [--etcd v3.6.5]
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from devtools import REPO
from devtools.gobuild import Binary, BuildError, GoTool, go_env, run_go

HERE = Path(__file__).resolve().parent
GO_MOD, GO_SUM = HERE / "go.mod", HERE / "go.sum"

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

COMPONENTS = (
    Binary("etcd", "go.etcd.io/etcd/server/v3", "the API server's storage"),
    Binary("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", "the API server"),
    Binary("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager",
           "the Job, CronJob, garbage-collector and other controllers"),
    Binary("kubectl", "k8s.io/kubernetes/cmd/kubectl", "the command line client"),
    Binary("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler",
           "the scheduler (binds pods to the node)"),
    Binary("kubelet", "k8s.io/kubernetes/cmd/kubelet",
           "the node's kubelet (runs pods through containerd)"),
)
NAMES = tuple(c.name for c in COMPONENTS)

TOOL = GoTool(
    label="controlplane", title="the control plane", module=HERE, binaries=COMPONENTS,
    flags=FLAGS, built={"kubernetes": KUBERNETES, "etcd": ETCD},
    first_build="a first build takes a long while: about 7 minutes of compiling on two "
    "cores (docs/BENCHMARKS.md), up to tens of minutes on a slower or busier "
    "machine or with the ~600 MB of modules still to download, and ~3 GB of Go's "
    "build cache; later builds reuse that cache, and nothing is rebuilt once "
    "cached")


def path(name: str) -> Path:
    """The built binary ``name`` for this wrapper module; BuildError if it is not built."""
    return TOOL.path(name)


def build(names: Sequence[str] = NAMES, *, env: dict[str, str] | None = None,
          links: bool = True) -> dict[str, Path]:
    """Build each of ``names`` that is not in the cache yet; their paths. Prints each step
    with its time."""
    return TOOL.build(names, env=env, links=links)


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
    go, _ = TOOL.toolchain()
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
    TOOL.say(f"wrote {GO_MOD.relative_to(REPO)} and go.sum: Kubernetes {kubernetes} "
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
        print(f"{TOOL.label}: {exc}", file=sys.stderr)
        return 2
    return 0
