"""The OpenTelemetry Collector the traces' tests send their spans to: the OTLP receiver and
the file exporter (the test reads the spans back from the file), built from pinned Go
modules like the control plane (devtools/controlplane).

``builder.yaml`` beside this file names the components and their versions; ``generate``
runs the collector's own builder (``go.opentelemetry.io/collector/cmd/builder``, at the
collector's version) on it and keeps what it writes here — ``go.mod``/``go.sum`` (every
module pinned) and the program's sources — never edited by hand. ``build`` compiles that
module once (``CGO_ENABLED=0``, ``-trimpath``), into a cache keyed by a hash of the module,
the Go version and the flags (``~/.cache/jobfence/otelcol/<key>/bin``), only when it is
missing, and links it into ``build/bin``. Standard library only.

    python -m devtools.otelcol build          # only when missing
    python -m devtools.otelcol path           # where the built binary is
    python -m devtools.otelcol generate       # rewrite the module from builder.yaml
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

from devtools import controlplane
from devtools.controlplane import (
    BuildError,
    _locked,
    _size,
    _version_tuple,
    go_binary,
    go_env,
    run_go,
)

HERE = Path(__file__).resolve().parent
LINKS = controlplane.LINKS
NAME = "otelcol-jobfence"
CONFIG = HERE / "builder.yaml"
GENERATED = ("go.mod", "go.sum", "main.go", "components.go", "main_others.go",
             "main_windows.go")
FLAGS = ("-trimpath", "-ldflags=-s -w")
"""``go build`` flags; with ``CGO_ENABLED=0``, a static binary. Part of the key."""


def say(message: str) -> None:
    print(f"otelcol: {message}", flush=True)


def collector_version() -> str:
    """The collector's version, as builder.yaml pins its OTLP receiver."""
    match = re.search(r"receiver/otlpreceiver (v\S+)", CONFIG.read_text())
    if not match:
        raise BuildError("devtools/otelcol/builder.yaml pins no otlpreceiver version")
    return match.group(1)


def required_go() -> str:
    match = re.search(r"^go (\S+)$", (HERE / "go.mod").read_text(), re.M)
    return match.group(1) if match else "1.26"


def go_version(go: str) -> str:
    out = run_go(go, "env", "GOVERSION", cwd=HERE, capture=True).strip().removeprefix("go")
    if _version_tuple(out) < _version_tuple(required_go()):
        raise BuildError(f"Go {out} is too old to build the collector: it needs Go >= "
                         f"{required_go()} (https://go.dev/dl/)")
    return out


def cache_root() -> Path:
    return controlplane.cache_root("otelcol")


def _module_digest() -> str:
    h = hashlib.sha256()
    for name in GENERATED:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    return h.hexdigest()


def key(version: str) -> str:
    h = hashlib.sha256()
    for part in (_module_digest().encode(), version.encode(), " ".join(FLAGS).encode(),
                 f"{platform.system()}/{platform.machine()}".encode()):
        h.update(part + b"\0")
    return h.hexdigest()[:16]


def _recorded() -> Path | None:
    """The binary build/bin links to, when it was built from this very module (a machine
    that has it needs no Go to find it)."""
    link = LINKS / NAME
    if not link.is_symlink():
        return None
    target = Path(os.readlink(link))
    stamp = target.parent.parent / "key"
    if target.is_relative_to(cache_root()) and stamp.exists() \
            and stamp.read_text().strip() == _module_digest() and target.exists():
        return target
    return None


def path() -> Path:
    """The built collector for this module; BuildError when it is not built."""
    with contextlib.suppress(BuildError):
        built = cache_root() / key(go_version(go_binary())) / "bin" / NAME
        if built.exists():
            return built
    recorded = _recorded()
    if recorded is not None:
        return recorded
    raise BuildError(f"{NAME} is not built for devtools/otelcol/go.mod: run "
                     "`python -m devtools.otelcol build` (make test does)")


def build() -> Path:
    """Build the collector unless the cache has it; its path. Prints each step's time."""
    try:
        go = go_binary()
    except BuildError:
        recorded = _recorded()
        if recorded is not None:
            return recorded
        raise
    version = go_version(go)
    out = cache_root() / key(version) / "bin"
    with _locked(out.parent):
        if not (out / NAME).exists():
            say(f"building {NAME} (the OpenTelemetry Collector {collector_version()}: OTLP "
                f"receiver, file exporter) with Go {version}, pinned in "
                f"devtools/otelcol/go.mod, cached in {out}")
            say("a first build takes a few minutes on two cores (about 3 with the modules "
                "already downloaded); nothing is rebuilt once cached")
            env = go_env()
            started = time.monotonic()
            run_go(go, "mod", "download", cwd=HERE, env=env)
            say(f"modules downloaded in {time.monotonic() - started:.0f} s")
            started = time.monotonic()
            out.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                target = Path(tmp) / NAME
                run_go(go, "build", *FLAGS, "-o", str(target), ".", cwd=HERE, env=env)
                os.replace(target, out / NAME)
            say(f"built {NAME} in {time.monotonic() - started:.0f} s ({_size(out / NAME)})")
            (out.parent / "built.json").write_text(json.dumps(
                {"go": version, "flags": FLAGS, "collector": collector_version()},
                indent=2) + "\n")
        (out.parent / "key").write_text(_module_digest() + "\n")
    controlplane.link_binary(out / NAME)
    return out / NAME


def generate() -> None:
    """Rewrite the module from builder.yaml with the collector's builder at the collector's
    version (go.mod, go.sum and the sources it writes; nothing compiled)."""
    go = go_binary()
    go_version(go)
    env = {**go_env(), "GOFLAGS": "-mod=mod -buildvcs=false"}
    builder = f"go.opentelemetry.io/collector/cmd/builder@{collector_version()}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copyfile(CONFIG, work / "builder.yaml")
        run_go(go, "run", builder, "--config", "builder.yaml", "--skip-compilation",
               cwd=work, env=env)
        for name in GENERATED:
            shutil.copyfile(work / "out" / name, HERE / name)
    say(f"wrote devtools/otelcol ({', '.join(GENERATED)}) with {builder}")


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
        print(f"otelcol: {exc}", file=sys.stderr)
        return 2
    return 0
