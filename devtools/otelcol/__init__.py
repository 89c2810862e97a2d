"""The OpenTelemetry Collector the traces' tests send their spans to: the OTLP receiver and
the file exporter (the test reads the spans back from the file), built from pinned Go
modules like the control plane (devtools/controlplane).

``builder.yaml`` beside this file names the components and their versions; ``generate``
runs the collector's own builder (``go.opentelemetry.io/collector/cmd/builder``, at the
collector's version) on it and keeps what it writes here — ``go.mod``/``go.sum`` (every
module pinned) and the program's sources — never edited by hand. ``build`` compiles that
module once (``CGO_ENABLED=0``, ``-trimpath``), into a cache keyed by a hash of the module,
the Go version and the flags (``~/.cache/jobfence/otelcol/<key>/bin``), only when it is
missing, and links it into ``build/bin`` (devtools.gobuild, the builder of every pinned Go
tool). Standard library only.

    python -m devtools.otelcol build          # only when missing
    python -m devtools.otelcol path           # where the built binary is
    python -m devtools.otelcol generate       # rewrite the module from builder.yaml
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from devtools.gobuild import Binary, BuildError, GoTool, go_env, run_go

HERE = Path(__file__).resolve().parent
NAME = "otelcol-jobfence"
CONFIG = HERE / "builder.yaml"
GENERATED = ("go.mod", "go.sum", "main.go", "components.go", "main_others.go",
             "main_windows.go")
FLAGS = ("-trimpath", "-ldflags=-s -w")
"""``go build`` flags; with ``CGO_ENABLED=0``, a static binary. Part of the key."""


def collector_version() -> str:
    """The collector's version, as builder.yaml pins its OTLP receiver."""
    match = re.search(r"receiver/otlpreceiver (v\S+)", CONFIG.read_text())
    if not match:
        raise BuildError("devtools/otelcol/builder.yaml pins no otlpreceiver version")
    return match.group(1)


TOOL = GoTool(
    label="otelcol", title="the collector", module=HERE, flags=FLAGS, sources=GENERATED,
    binaries=(Binary(NAME, ".", f"the OpenTelemetry Collector {collector_version()}: OTLP "
                     "receiver, file exporter"),),
    built={"collector": collector_version()},
    first_build="a first build takes a few minutes on two cores (about 3 with the modules "
    "already downloaded); nothing is rebuilt once cached")


def path() -> Path:
    """The built collector for this module; BuildError when it is not built."""
    return TOOL.path(NAME)


def build() -> Path:
    """Build the collector unless the cache has it; its path. Prints each step's time."""
    return TOOL.build()[NAME]


def generate() -> None:
    """Rewrite the module from builder.yaml with the collector's builder at the collector's
    version (go.mod, go.sum and the sources it writes; nothing compiled)."""
    go, _ = TOOL.toolchain()
    env = {**go_env(), "GOFLAGS": "-mod=mod -buildvcs=false"}
    builder = f"go.opentelemetry.io/collector/cmd/builder@{collector_version()}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copyfile(CONFIG, work / "builder.yaml")
        run_go(go, "run", builder, "--config", "builder.yaml", "--skip-compilation",
               cwd=work, env=env)
        for name in GENERATED:
            shutil.copyfile(work / "out" / name, HERE / name)
    TOOL.say(f"wrote devtools/otelcol ({', '.join(GENERATED)}) with {builder}")


def main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.otelcol",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("build", "path", "generate"))
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build()
        elif args.command == "path":
            print(path())
        else:
            generate()
    except BuildError as exc:
        print(f"{TOOL.label}: {exc}", file=sys.stderr)
        return 2
    return 0
