"""What every part of devtools.image shares: the names, running a program, the builder
(docker or buildah with runc) and what it says of an image."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools import REPO

HERE = Path(__file__).resolve().parent
OUT = REPO / "build" / "image"
SYSTEM_PACKAGES = HERE.parent / "system-packages.sh"

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
DEFAULT_IMAGE = f"localhost/jobfence:{VERSION}"
"""A name with a registry host: a bare ``jobfence:VERSION`` means Docker Hub to Kubernetes."""
OFFICIAL_BASE = "docker.io/library/python:3.11-slim"
"""What the Dockerfile's default ``PYTHON_IMAGE`` (``python:3.11-slim``) means."""
LOCAL_BASE = "localhost/jobfence-python:3.11"
BUILD_BASE = "localhost/jobfence-build"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
"""The pause image of Kubernetes 1.35 (kubeadm's ``PauseVersion``); the kubelet itself names
none since 1.35, the container runtime's ``sandbox_image`` does."""
RECIPE_LABEL = "dev.jobfence.recipe"
INPUTS_LABEL = "dev.jobfence.inputs"


class ImageError(RuntimeError):
    """Something a person must fix (no builder, a failed step): one line."""


def say(message: str) -> None:
    print(f"image: {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """``JOBFENCE_IMAGE_CACHE``, else ``$XDG_CACHE_HOME/jobfence/image``: the wheels and the
    work directories, outside the work tree."""
    base = os.environ.get("JOBFENCE_IMAGE_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "jobfence" / "image"


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """One build of ``name`` at a time (two make runs, two test processes)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run(argv: Sequence[str | Path], *, what: str, capture: bool = True,
        timeout: float | None = None, **kw: object) -> str:
    """Run ``argv``; its stdout. A failure is an ImageError naming ``what`` and the last line
    the program said."""
    try:
        out = subprocess.run([str(a) for a in argv], text=True, check=False, timeout=timeout,
                             stdout=subprocess.PIPE if capture else sys.stderr,
                             stderr=subprocess.PIPE, **kw)  # type: ignore[call-overload]
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{what}: no answer within {timeout:.0f} s") from exc
    except FileNotFoundError as exc:
        raise ImageError(f"{what}: {argv[0]} is not installed") from exc
    if out.returncode != 0:
        lines = [ln for ln in (out.stderr or "").strip().splitlines() if ln.strip()]
        raise ImageError(f"{what} failed (exit {out.returncode})"
                         + (f": {lines[-1].strip()}" if lines else ""))
    return out.stdout or ""


# -- the builder ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Builder:
    kind: str
    """``docker`` or ``buildah``."""
    program: str
    runtime: str = ""
    """buildah's OCI runtime (runc)."""


def docker_answers(docker: str | None = None) -> str | None:
    """The docker client whose daemon answers within a few seconds, if any."""
    program = shutil.which(docker or os.environ.get("DOCKER") or "docker")
    if program is None:
        return None
    try:
        out = subprocess.run([program, "info", "--format", "{{.ServerVersion}}"],
                             capture_output=True, text=True, timeout=10, check=False)
    except subprocess.TimeoutExpired:
        return None
    return program if out.returncode == 0 and out.stdout.strip() else None


def find_builder(*, install: bool = True, allow_docker: bool = True) -> Builder:
    """docker where its daemon answers, else buildah with runc; as root, buildah and runc are
    installed from Debian's packages when missing."""
    if allow_docker:
        docker = docker_answers()
        if docker is not None:
            return Builder("docker", docker)
    def programs() -> dict[str, str | None]:
        return {p: which(os.environ.get(p.upper()) or p) for p in ("buildah", "runc")}

    found = programs()
    if None in found.values() and install and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run([str(SYSTEM_PACKAGES), "image"], check=False, stdout=sys.stderr)
        found = programs()
    if None in found.values():
        raise ImageError("no container builder here: install buildah and runc (as root: "
                         "apt-get install -y buildah runc debootstrap catatonit) or start a "
                         "Docker engine, then run make image again")
    return Builder("buildah", str(found["buildah"]), str(found["runc"]))


def which(name: str) -> str | None:
    """``name`` on PATH or in the system's sbin (root's PATH may lack it); an absolute
    ``name`` if it is executable."""
    if os.path.isabs(name):
        return name if os.access(name, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    for directory in ("/usr/sbin", "/usr/bin", "/sbin"):
        if os.access(f"{directory}/{name}", os.X_OK):
            return f"{directory}/{name}"
    return None


def buildah(builder: Builder, *args: str | Path, what: str, capture: bool = True,
            timeout: float | None = None) -> str:
    return run([builder.program, *args], what=what, capture=capture, timeout=timeout)


def image_labels(builder: Builder, name: str) -> dict[str, str] | None:
    """The labels of the local image ``name``; None if there is none."""
    try:
        if builder.kind == "docker":
            out = run([builder.program, "image", "inspect", name], what=f"inspect {name}")
            return dict(json.loads(out)[0].get("Config", {}).get("Labels") or {})
        out = buildah(builder, "inspect", "--type", "image", name, what=f"inspect {name}")
    except ImageError:
        return None
    config = json.loads(out).get("OCIv1", {}).get("config", {})
    return dict(config.get("Labels") or {})


def image_id(builder: Builder, name: str) -> str:
    out = buildah(builder, "inspect", "--type", "image", name, what=f"inspect {name}")
    return str(json.loads(out)["FromImageID"])




def du(path: Path) -> int:
    out = run(["du", "-sb", path], what="du")
    return int(out.split()[0])


@dataclass(frozen=True)
class Built:
    name: str
    id: str
    digest: str
    size: int
    """Bytes, uncompressed: the sum of its layers."""
    layers: tuple[tuple[int, str], ...]
    """(bytes, what made it) per layer, the base's first."""
    built: bool
    """False when an image of the same inputs was already there."""
    seconds: float

    def line(self) -> str:
        state = f"built in {self.seconds:.0f} s" if self.built else "up to date"
        return f"{self.name} {state}: {self.size / 1e6:.0f} MB, {self.digest}"


def describe(builder: Builder, name: str, *, built: bool = False,
             seconds: float = 0.0) -> Built:
    """Name, id, digest, size and layers of the local image ``name``."""
    if builder.kind == "docker":
        out = json.loads(run([builder.program, "image", "inspect", name],
                             what=f"docker image inspect {name}"))[0]
        rows = run([builder.program, "history", "--no-trunc", "--human=false", "--format",
                    "{{.Size}}\t{{.CreatedBy}}", name], what=f"docker history {name}")
        history = [(int(size), step) for size, _, step in
                   (row.partition("\t") for row in reversed(rows.splitlines())) if size != "0"]
        digests = out.get("RepoDigests") or [out["Id"]]
        return Built(name, out["Id"], digests[0].split("@")[-1], int(out["Size"]),
                     tuple(history), built, seconds)
    data = json.loads(buildah(builder, "inspect", "--type", "image", name,
                              what=f"inspect {name}"))
    manifest = json.loads(data["Manifest"])
    sizes = [int(layer.get("size", 0)) for layer in manifest.get("layers", [])]
    steps = [h.get("created_by", "") for h in data.get("History") or []
             if not h.get("empty_layer")]
    steps = ([""] * (len(sizes) - len(steps)) + steps)[-len(sizes):] if sizes else []
    return Built(name, data["FromImageID"], data["FromImageDigest"], sum(sizes),
                 tuple(zip(sizes, steps, strict=True)), built, seconds)



def run_in(builder: Builder, image: str, argv: Sequence[str], *, user: str | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (not the entrypoint) in a fresh container of ``image``, with no network,
    as the image's user unless ``user`` is given; what it printed and its exit code."""
    if builder.kind == "docker":
        return subprocess.run(
            [builder.program, "run", "--rm", "--network", "none", "--entrypoint", argv[0],
             *(["--user", user] if user else []), image, *argv[1:]],
            capture_output=True, text=True, timeout=timeout, check=False)
    container = buildah(builder, "from", "--pull=never", "--quiet", image,
                        what=f"buildah from {image}").strip()
    try:
        return subprocess.run(
            [builder.program, "run", "--runtime", builder.runtime, "--network", "none",
             *(["--user", user] if user else []), container, "--", *argv],
            capture_output=True, text=True, timeout=timeout, check=False)
    finally:
        buildah(builder, "rm", container, what="buildah rm")
