"""A build that needs no network inside the builder: the dependencies' wheels downloaded on
this machine (``pip download`` for CPython 3.11 on manylinux, binary wheels only, cached by
the requirements' hash), carried by a build base that tells pip to use only them — the
Dockerfile's ``BUILD_IMAGE``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from devtools.image.common import (
    BUILD_BASE,
    REPO,
    Builder,
    ImageError,
    buildah,
    cache_root,
    du,
    image_id,
    image_labels,
    locked,
    run,
    say,
)

WHEEL_TARGET = ("3.11", "cp", "cp311", 36)
"""The wheels' interpreter, implementation, ABI and glibc minor: CPython 3.11 on bookworm's
glibc 2.36, as both bases are."""


def platforms(machine: str, glibc_minor: int) -> list[str]:
    """Every manylinux tag a glibc 2.``glibc_minor`` system runs, newest first: pip takes
    ``--platform`` tags as given (it widens only the legacy manylinux2014/2010 aliases)."""
    return [*(f"manylinux_2_{m}_{machine}" for m in range(glibc_minor, 4, -1)),
            f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]




def requirements() -> list[str]:
    """What the Dockerfile's ``pip wheel ".[otel]"`` resolves: jobfence's dependencies, its
    ``otel`` extra, and its build system (built in isolation, from the same wheels)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [*project["build-system"]["requires"], *project["project"]["dependencies"],
            *project["project"]["optional-dependencies"]["otel"]]


def wheelhouse_digest() -> str:
    """The wheels' cache key: the requirements and the interpreter they are for."""
    key = [requirements(), WHEEL_TARGET, platform.machine()]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


def ensure_wheelhouse() -> Path:
    """The dependencies' wheels for the image's Python, downloaded on this machine once per
    set of requirements (``pip download`` for CPython 3.11 on manylinux, binary wheels only:
    nothing compiles); their directory."""
    python, impl, abi, glibc = WHEEL_TARGET
    reqs = requirements()
    machine = platform.machine()
    target = cache_root() / "wheelhouse" / wheelhouse_digest()
    if (target / ".complete").exists():
        return target
    with locked("wheelhouse"):
        if (target / ".complete").exists():
            return target
        say(f"downloading the wheels of {len(reqs)} requirements for CPython {python} "
            f"into {target} (once)")
        started = time.monotonic()
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                 "--no-cache-dir", "--only-binary=:all:", "--dest", tmp,
                 "--python-version", python, "--implementation", impl, "--abi", abi,
                 *(f"--platform={tag}" for tag in platforms(machine, glibc)), *reqs],
                what="downloading the image's wheels (pip download)", timeout=1800)
            Path(tmp, ".complete").write_text(json.dumps(reqs) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
            target.chmod(0o755)
        say(f"wheels downloaded in {time.monotonic() - started:.0f} s "
            f"({du(target) / 1e6:.0f} MB)")
    return target


def build_base_name(builder: Builder, base: str, wheels: str) -> str:
    """The build base of ``base`` and the wheels of digest ``wheels``."""
    both = f"{image_id(builder, base)} {wheels}"
    return f"{BUILD_BASE}:{hashlib.sha256(both.encode()).hexdigest()[:16]}"


def ensure_build_base(builder: Builder, base: str, wheelhouse: Path) -> str:
    """``base`` with the wheelhouse at /wheelhouse and pip told to use only it: the
    Dockerfile's ``BUILD_IMAGE``, named by the hash of both."""
    name = build_base_name(builder, base, wheelhouse.name)
    with locked("build-base"):
        if image_labels(builder, name) is not None:
            return name
        container = buildah(builder, "from", "--pull=never", base,
                            what=f"buildah from {base}").strip()
        try:
            buildah(builder, "copy", "--quiet", container, str(wheelhouse), "/wheelhouse",
                    what="copying the wheels into the build base")
            buildah(builder, "config", "--env", "PIP_NO_INDEX=1", "--env",
                    "PIP_FIND_LINKS=/wheelhouse", container, what="buildah config")
            buildah(builder, "commit", "--rm", "--quiet", container, name,
                    what="buildah commit of the build base")
        except BaseException:
            with contextlib.suppress(ImageError):
                buildah(builder, "rm", container, what="buildah rm")
            raise
    return name
