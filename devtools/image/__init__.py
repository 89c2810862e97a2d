"""The one image (the repository's Dockerfile), built where there is no Docker engine, and the
images a local cluster's node imports.

* **builder**: ``docker build`` where a Docker daemon answers; else Debian's ``buildah`` with
  ``runc`` as its runtime (Debian's ``crun`` refuses this kind of host's hybrid cgroups),
  installed from Debian's packages by ``devtools/system-packages.sh image`` as root, named in
  one line otherwise.
* **base** (``make base-image``): where ``python:3.11-slim`` cannot be pulled (no public
  container registry reachable), a local one in its place, ``localhost/jobfence-python:3.11``:
  Debian bookworm by ``debootstrap --variant=minbase`` from the host's own apt mirror, with
  ``python3``, pip, venv, ``ca-certificates`` and ``tini`` (so the image's last stage needs no
  network), trimmed as Debian's slim images are, and without ``EXTERNALLY-MANAGED`` (pip
  then installs as in the official image). Rebuilt only when its recipe changes (the recipe's
  hash is a label of the image).
* **offline build**: with buildah, the dependencies' wheels are downloaded on this machine
  (for CPython 3.11 on manylinux, cached by the requirements' hash) into a build base
  ``localhost/jobfence-build:HASH`` that sets ``PIP_NO_INDEX``/``PIP_FIND_LINKS``, passed as
  the Dockerfile's ``BUILD_IMAGE``: its ``pip wheel`` then needs no network, and on the local
  base (tini already there) no builder step has any (``--network none``).
* **cache**: every build is also tagged ``localhost/jobfence-cache:<hash of its inputs>``
  (Dockerfile, the files its build copies, the bases); a build with the same inputs finds it,
  names it again and builds nothing, whatever another checkout on the machine built since.
* **archives** (``make image-archive``): the image and a pause image (Debian's
  ``catatonit -P`` in a scratch image as uid 65535, named as the pause image Kubernetes 1.35
  installs by default) as ``docker-archive`` files under ``build/image``, for
  ``ctr -n k8s.io images import``.

Standard library only: ``make image`` runs before any virtualenv exists. ``common`` holds the
names and the builder, ``base`` the local base, ``wheels`` the offline build's wheels; this
module the image, the pause image, the archives and the command line.

    python -m devtools.image base [--force]
    python -m devtools.image build [--image NAME] [--python-image BASE] [--force]
    python -m devtools.image archive [--image NAME]
    python -m devtools.image info [--image NAME]
"""


from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devtools.image.base import BASE_PACKAGES, Mirror, apt_mirror, base_recipe, ensure_base
from devtools.image.common import (
    DEFAULT_IMAGE,
    INPUTS_LABEL,
    LOCAL_BASE,
    OFFICIAL_BASE,
    OUT,
    PAUSE_IMAGE,
    RECIPE_LABEL,
    REPO,
    SYSTEM_PACKAGES,
    VERSION,
    Builder,
    Built,
    ImageError,
    buildah,
    describe,
    find_builder,
    image_id,
    image_labels,
    locked,
    run,
    run_in,
    say,
    which,
)
from devtools.image.wheels import (
    build_base_name,
    ensure_build_base,
    ensure_wheelhouse,
    platforms,
    requirements,
    wheelhouse_digest,
)

__all__ = ["BASE_PACKAGES", "DEFAULT_IMAGE", "LOCAL_BASE", "PAUSE_IMAGE", "RECIPE_LABEL",
           "VERSION", "Builder", "Built", "ImageError", "Mirror", "apt_mirror", "archive",
           "base_recipe", "build", "build_base_name", "buildah", "describe", "ensure_base",
           "ensure_pause", "export", "find_builder", "image_labels", "inputs_hash", "main",
           "platforms", "requirements", "run", "run_in", "wheelhouse_digest"]

CONTEXT = ("pyproject.toml", "README.md", "shared", "functions")
"""What the Dockerfile's build stage copies (the only files .dockerignore lets in)."""


def inputs_hash(*parts: str) -> str:
    """The hash of the Dockerfile, every file the build copies and ``parts`` (the bases)."""
    h = hashlib.sha256()
    files = [REPO / "Dockerfile"]
    for name in CONTEXT:
        path = REPO / name
        files += sorted(p for p in path.rglob("*") if p.is_file()
                        and "__pycache__" not in p.parts and p.suffix != ".pyc") \
            if path.is_dir() else [path]
    for path in files:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def choose_base(builder: Builder, python_image: str | None) -> str:
    """``python_image`` if given; else the official slim Python if it is here or can be
    pulled; else the local base (built if missing)."""
    if python_image:
        return python_image
    if image_labels(builder, OFFICIAL_BASE) is not None:
        return OFFICIAL_BASE
    try:
        buildah(builder, "pull", "--quiet", OFFICIAL_BASE, what=f"pulling {OFFICIAL_BASE}",
                timeout=300)
        return OFFICIAL_BASE
    except ImageError as exc:
        why = str(exc).rsplit(": ", 1)[-1]
        say(f"python:3.11-slim cannot be pulled here ({why}): building on the local base "
            f"{LOCAL_BASE} instead (make base-image)")
    return ensure_base(builder)


CACHE_REPO = "localhost/jobfence-cache"
"""Every build is also tagged ``CACHE_REPO:<inputs' hash>``: the image store is the
machine's, shared by every checkout on it, and a name such as ``localhost/jobfence:0.1.0``
moves to whichever checkout built last. Found by its inputs, an image is only tagged again,
never rebuilt."""
KEEP_CACHED = 4
"""How many cache tags stay (the newest): each holds a layer of jobfence (~135 MB)."""


def build(image: str = DEFAULT_IMAGE, *, python_image: str | None = None,
          force: bool = False, quiet: bool = False) -> Built:
    """Build the Dockerfile as ``image`` unless an image of the same inputs is there (then
    ``image`` names it again)."""
    builder = find_builder()
    started = time.monotonic()
    if builder.kind == "docker":
        # The daemon pulls the base itself: its name stands for it in the inputs.
        inputs = inputs_hash(python_image or "python:3.11-slim")
        with locked("build"):
            found = _cached(builder, image, inputs, force)
            if found is not None:
                return found
            argv = [builder.program, "build", "--tag", image, "--tag",
                    f"{CACHE_REPO}:{inputs}", "--label", f"{INPUTS_LABEL}={inputs}"]
            if python_image:
                argv += ["--build-arg", f"PYTHON_IMAGE={python_image}"]
            if quiet:
                argv.append("--quiet")
            run([*argv, REPO], what="docker build", capture=quiet, timeout=3600)
            _prune(builder)
        return _built(builder, image, inputs, time.monotonic() - started)
    base = choose_base(builder, python_image)
    wheelhouse = ensure_wheelhouse()
    build_base = ensure_build_base(builder, base, wheelhouse)
    # The build base's name stands for it: it is made of the base's id and the wheels'
    # digest, and the same build base made again (another id) changes nothing.
    inputs = inputs_hash(image_id(builder, base), build_base)
    with locked("build"):
        found = _cached(builder, image, inputs, force)
        if found is not None:
            return found
        # The local base brings tini, and the wheels are in the build base: no step needs a
        # network. Another base may need apt for tini, through this machine's network (not
        # a bridge buildah would make on the host).
        network = "none" if base == LOCAL_BASE else "host"
        say(f"building {image} with buildah on {base} (network {network})")
        bud = ["bud", "--runtime", builder.runtime, "--network", network, "--pull=never",
               "--layers=false", "--label", f"{INPUTS_LABEL}={inputs}",
               "--build-arg", f"PYTHON_IMAGE={base}", "--build-arg", f"BUILD_IMAGE={build_base}",
               "--tag", image, "--tag", f"{CACHE_REPO}:{inputs}",
               "--file", str(REPO / "Dockerfile")]
        if quiet:
            bud.append("--quiet")
        buildah(builder, *bud, REPO, what="buildah bud", capture=quiet, timeout=3600)
        _prune(builder)
    return _built(builder, image, inputs, time.monotonic() - started)


def _cached(builder: Builder, image: str, inputs: str, force: bool) -> Built | None:
    """The image of these inputs, named ``image`` again, if it is there."""
    cached = f"{CACHE_REPO}:{inputs}"
    if force or image_labels(builder, cached) is None:
        return None
    if image_labels(builder, image) is None or image_id(builder, image) != \
            image_id(builder, cached):
        run([builder.program, "tag", cached, image], what=f"tagging {cached} as {image}")
    return _named(describe(builder, cached), image)


def _built(builder: Builder, image: str, inputs: str, seconds: float) -> Built:
    return _named(describe(builder, f"{CACHE_REPO}:{inputs}", built=True, seconds=seconds),
                  image)


def _named(built: Built, image: str) -> Built:
    """``built`` (described by its cache tag: another checkout may take the name meanwhile)
    under the name asked for."""
    return dataclasses.replace(built, name=image)


def _prune(builder: Builder) -> None:
    """Untag all but the newest ``KEEP_CACHED`` cache tags (an image another name still
    holds stays)."""
    if builder.kind == "docker":
        rows = run([builder.program, "image", "ls", "--format", "{{.CreatedAt}}\t{{.Tag}}",
                    CACHE_REPO], what="docker image ls").splitlines()
        tags = [row.split("\t")[1] for row in sorted(rows, reverse=True)]
    else:
        images = json.loads(buildah(builder, "images", "--json", what="buildah images") or "[]")
        named = sorted(((i.get("created", 0), n) for i in images for n in i.get("names") or []
                        if n.startswith(f"{CACHE_REPO}:")), reverse=True)
        tags = [n.split(":", 1)[1] for _, n in named]
    for tag in tags[KEEP_CACHED:]:
        with contextlib.suppress(ImageError):
            run([builder.program, "rmi", f"{CACHE_REPO}:{tag}"], what="untagging an old build")


# -- the pause image and the archives ------------------------------------------------------------


def ensure_pause(builder: Builder) -> str:
    """The pause image of the local cluster's node: Debian's catatonit in pause mode, alone in
    a scratch image, as uid 65535 (as the upstream pause image runs), named ``PAUSE_IMAGE``."""
    catatonit = which("catatonit")
    if catatonit is None:
        subprocess.run([str(SYSTEM_PACKAGES), "image"], check=False, stdout=sys.stderr)
        catatonit = which("catatonit")
    if catatonit is None:
        raise ImageError("the pause image is Debian's catatonit: install it "
                         "(apt-get install -y catatonit) and run make image-archive again")
    recipe = hashlib.sha256(Path(catatonit).read_bytes()).hexdigest()[:16]
    with locked("pause"):
        labels = image_labels(builder, PAUSE_IMAGE)
        if labels is not None and labels.get(RECIPE_LABEL) == recipe:
            return PAUSE_IMAGE
        container = buildah(builder, "from", "scratch", what="buildah from scratch").strip()
        try:
            buildah(builder, "copy", "--quiet", "--chmod", "0755", container, catatonit,
                    "/catatonit", what="copying catatonit")
            buildah(builder, "config", "--entrypoint", '["/catatonit", "-P"]', "--user",
                    "65535:65535", "--label", f"{RECIPE_LABEL}={recipe}", container,
                    what="buildah config")
            buildah(builder, "commit", "--rm", "--quiet", container, PAUSE_IMAGE,
                    what="buildah commit of the pause image")
        except BaseException:
            with contextlib.suppress(ImageError):
                buildah(builder, "rm", container, what="buildah rm")
            raise
    return PAUSE_IMAGE


def export(builder: Builder, image: str, target: Path) -> Path:
    """``image`` as a docker-archive file at ``target`` (written whole, then renamed), for
    ``ctr -n k8s.io images import``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    if builder.kind == "docker":
        run([builder.program, "save", "--output", tmp, image], what=f"docker save {image}")
    else:
        buildah(builder, "push", "--quiet", image, f"docker-archive:{tmp}:{image}",
                what=f"buildah push {image}")
    os.replace(tmp, target)
    return target


def archive(image: str = DEFAULT_IMAGE, *, python_image: str | None = None) -> list[Path]:
    """The image (built if needed) and the pause image as files under build/image."""
    built = build(image, python_image=python_image)
    say(built.line())
    builder = find_builder()
    out = [export(builder, image, OUT / "jobfence.tar")]
    if builder.kind == "buildah":
        out.append(export(builder, ensure_pause(builder), OUT / "pause.tar"))
    else:
        say("the pause image is made with buildah: not with docker")
    return out


# -- the command line ----------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.image",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("base", help="build the local Python base (once; cached by its recipe)")
    b.add_argument("--force", action="store_true", help="rebuild even if it is there")
    for name, what in (("build", "build the image unless one of the same inputs is there"),
                       ("archive", "write the image and the pause image under build/image"),
                       ("info", "name, size, digest and layers of the built image")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--image", default=DEFAULT_IMAGE)
        if name != "info":
            p.add_argument("--python-image", default=os.environ.get("PYTHON_IMAGE") or None,
                           help="the base (default: python:3.11-slim, else the local base)")
        if name == "build":
            p.add_argument("--force", action="store_true", help="build even if up to date")
    args = parser.parse_args(argv)
    try:
        if args.command == "base":
            print(ensure_base(find_builder(allow_docker=False), force=args.force))
        elif args.command == "build":
            built = build(args.image, python_image=args.python_image, force=args.force)
            print(built.line())
        elif args.command == "archive":
            for path in archive(args.image, python_image=args.python_image):
                print(f"{path.relative_to(REPO)} ({path.stat().st_size / 1e6:.0f} MB)")
        else:
            built = describe(find_builder(install=False), args.image)
            print(built.line())
            for size, step in built.layers:
                print(f"  {size / 1e6:8.1f} MB  {step[:100]}")
    except ImageError as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 2
    return 0
