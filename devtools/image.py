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
* **cache**: the image carries the hash of its inputs (Dockerfile, the files its build copies,
  the bases) as a label; a build with the same inputs finds it and builds nothing.
* **archives** (``make image-archive``): the image and a pause image (Debian's
  ``catatonit -P`` in a scratch image as uid 65535, named as the pause image Kubernetes 1.35
  installs by default) as ``docker-archive`` files under ``build/image``, for
  ``ctr -n k8s.io images import``.

Standard library only: ``make image`` runs before any virtualenv exists.

    python -m devtools.image base [--force]
    python -m devtools.image build [--image NAME] [--python-image BASE] [--force]
    python -m devtools.image archive [--image NAME]
    python -m devtools.image info [--image NAME]
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = REPO / "build" / "image"
SYSTEM_PACKAGES = HERE / "system-packages.sh"

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

SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3",
                 "ca-certificates", "tini")
TRIMMED = ("usr/share/doc/*/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*",
           "usr/share/lintian/*", "var/cache/apt/*.bin", "var/lib/apt/lists/*",
           "var/cache/debconf/*-old", "var/log/*.log", "var/log/apt/*")
"""Removed from the base, as Debian's slim images leave them out (globs under the root), but
for each package's ``copyright`` file and ``locale.alias``."""
KEPT = ("copyright", "locale.alias")
DPKG_EXCLUDES = """\
# Written by jobfence's devtools/image.py, as in Debian's slim images: what later package
# installs leave out (their copyright files stay).
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
"""
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8"}
WHEEL_TARGET = ("3.11", "cp", "cp311", 36)
"""The wheels' interpreter, implementation, ABI and glibc minor: CPython 3.11 on bookworm's
glibc 2.36, as both bases are."""


def platforms(machine: str, glibc_minor: int) -> list[str]:
    """Every manylinux tag a glibc 2.``glibc_minor`` system runs, newest first: pip takes
    ``--platform`` tags as given (it widens only the legacy manylinux2014/2010 aliases)."""
    return [*(f"manylinux_2_{m}_{machine}" for m in range(glibc_minor, 4, -1)),
            f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]


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
def _locked(name: str) -> Iterator[None]:
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
        return {p: _which(os.environ.get(p.upper()) or p) for p in ("buildah", "runc")}

    found = programs()
    if None in found.values() and install and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run([str(SYSTEM_PACKAGES), "image"], check=False, stdout=sys.stderr)
        found = programs()
    if None in found.values():
        raise ImageError("no container builder here: install buildah and runc (as root: "
                         "apt-get install -y buildah runc debootstrap catatonit) or start a "
                         "Docker engine, then run make image again")
    return Builder("buildah", str(found["buildah"]), str(found["runc"]))


def _which(name: str) -> str | None:
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


# -- the local base ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Mirror:
    debian: str
    security: str


def apt_mirror(sources: Path = Path("/etc/apt")) -> Mirror:
    """The Debian mirror this machine's apt uses (the one network it may reach):
    ``JOBFENCE_DEBIAN_MIRROR`` if set, else the first ``deb`` source of a bookworm suite in
    /etc/apt/sources.list(.d), one-line or deb822; deb.debian.org where none is Debian."""
    found: list[tuple[str, list[str]]] = []
    files = [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
                if "deb" in fields.get("Types", "").split():
                    for uri in fields.get("URIs", "").split():
                        found.append((uri, fields.get("Suites", "").split()))
        elif path.suffix == ".list":
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    found.append((words[1], [words[2]]))
    debian = os.environ.get("JOBFENCE_DEBIAN_MIRROR") or next(
        (uri for uri, suites in found if SUITE in suites), "http://deb.debian.org/debian")
    security = next((uri for uri, suites in found if f"{SUITE}-security" in suites),
                    "http://deb.debian.org/debian-security")
    return Mirror(debian.rstrip("/"), security.rstrip("/"))


def base_recipe(mirror: Mirror) -> str:
    """The hash of everything the local base is made of: a change to any rebuilds it."""
    h = hashlib.sha256()
    for part in (SUITE, " ".join(BASE_PACKAGES), " ".join(TRIMMED), DPKG_EXCLUDES,
                 json.dumps(BASE_ENV, sort_keys=True), mirror.debian, mirror.security,
                 inspect.getsource(_make_rootfs), platform.machine()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _make_rootfs(root: Path, mirror: Mirror) -> None:
    """debootstrap the base into ``root``, bring it up to date from the security suite, trim
    it."""
    run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
         SUITE, root, mirror.debian], what="debootstrap of the Python base", timeout=1800)
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror.debian} {SUITE} main\n"
        f"deb {mirror.debian} {SUITE}-updates main\n"
        f"deb {mirror.security} {SUITE}-security main\n")
    (root / "etc/dpkg/dpkg.cfg.d/jobfence-slim").write_text(DPKG_EXCLUDES)
    shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
    env = {"PATH": BASE_ENV["PATH"], "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "upgrade", "-y", "-qq", "--no-install-recommends"],
                 ["apt-get", "clean"]):
        run(["chroot", root, *argv], what=f"{' '.join(argv[:2])} in the Python base",
            env=env, timeout=1800)
    (root / "etc/resolv.conf").write_text("")
    # PEP 668: Debian marks its Python as managed by apt; the official image does not, and
    # the Dockerfile's `pip install` must behave the same on both.
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for pattern in TRIMMED:
        for path in root.glob(pattern):
            if path.name not in KEPT:
                _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _du(path: Path) -> int:
    out = run(["du", "-sb", path], what="du")
    return int(out.split()[0])


def ensure_base(builder: Builder, *, force: bool = False) -> str:
    """The local base ``localhost/jobfence-python:3.11``, built unless an image of the same
    recipe is there; its name."""
    if builder.kind != "buildah":
        raise ImageError("the local Python base is built with buildah: install buildah and "
                         "runc (apt-get install -y buildah runc debootstrap)")
    mirror = apt_mirror()
    recipe = base_recipe(mirror)
    with _locked("base"):
        labels = image_labels(builder, LOCAL_BASE)
        if not force and labels is not None and labels.get(RECIPE_LABEL) == recipe:
            return LOCAL_BASE
        if os.geteuid() != 0:
            raise ImageError("the local Python base is made with debootstrap and chroot, as "
                             "root: run make base-image as root")
        if not _which("debootstrap"):
            subprocess.run([str(SYSTEM_PACKAGES), "image"], check=False, stdout=sys.stderr)
        say(f"building the local Python base {LOCAL_BASE}: Debian {SUITE} (minbase) with "
            f"{', '.join(BASE_PACKAGES)} from {mirror.debian} (once: 1-2 minutes on an idle "
            "machine, several on a busy one)")
        started = time.monotonic()
        work = cache_root() / "work"
        work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=work, prefix="base-") as tmp:
            root = Path(tmp) / "rootfs"
            root.mkdir()
            _make_rootfs(root, mirror)
            size = _du(root)
            container = buildah(builder, "from", "scratch", what="buildah from scratch").strip()
            try:
                mount = buildah(builder, "mount", container, what="buildah mount").strip()
                run(["cp", "-a", f"{root}/.", mount], what="copying the base into its image")
                config = ["config", "--cmd", "python3", "--label", f"{RECIPE_LABEL}={recipe}",
                          "--label", f"org.opencontainers.image.description=Debian {SUITE} "
                          "minbase with python3, pip, venv, ca-certificates and tini "
                          "(jobfence devtools/image.py)"]
                for k, v in BASE_ENV.items():
                    config += ["--env", f"{k}={v}"]
                buildah(builder, *config, container, what="buildah config")
                buildah(builder, "commit", "--rm", "--quiet", container, LOCAL_BASE,
                        what="buildah commit of the base")
            except BaseException:
                with contextlib.suppress(ImageError):
                    buildah(builder, "rm", container, what="buildah rm")
                raise
        say(f"built {LOCAL_BASE} in {time.monotonic() - started:.0f} s "
            f"({size / 1e6:.0f} MB, recipe {recipe})")
    return LOCAL_BASE


# -- the wheels, for a build that needs no network inside the builder --------------------------


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
    with _locked("wheelhouse"):
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
            f"({_du(target) / 1e6:.0f} MB)")
    return target


def build_base_name(builder: Builder, base: str, wheels: str) -> str:
    """The build base of ``base`` and the wheels of digest ``wheels``."""
    both = f"{image_id(builder, base)} {wheels}"
    return f"{BUILD_BASE}:{hashlib.sha256(both.encode()).hexdigest()[:16]}"


def ensure_build_base(builder: Builder, base: str, wheelhouse: Path) -> str:
    """``base`` with the wheelhouse at /wheelhouse and pip told to use only it: the
    Dockerfile's ``BUILD_IMAGE``, named by the hash of both."""
    name = build_base_name(builder, base, wheelhouse.name)
    with _locked("build-base"):
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


# -- the image ----------------------------------------------------------------------------------


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


def build(image: str = DEFAULT_IMAGE, *, python_image: str | None = None,
          force: bool = False, quiet: bool = False) -> Built:
    """Build the Dockerfile as ``image`` unless an image of the same inputs is there."""
    builder = find_builder()
    started = time.monotonic()
    if builder.kind == "docker":
        # The daemon pulls the base itself: its name stands for it in the inputs.
        inputs = inputs_hash(python_image or "python:3.11-slim")
        labels = image_labels(builder, image)
        if not force and labels is not None and labels.get(INPUTS_LABEL) == inputs:
            return describe(builder, image)
        argv = [builder.program, "build", "--tag", image, "--label", f"{INPUTS_LABEL}={inputs}"]
        if python_image:
            argv += ["--build-arg", f"PYTHON_IMAGE={python_image}"]
        if quiet:
            argv.append("--quiet")
        run([*argv, REPO], what="docker build", capture=quiet, timeout=3600)
        return describe(builder, image, built=True, seconds=time.monotonic() - started)
    base = choose_base(builder, python_image)
    wheelhouse = ensure_wheelhouse()
    build_base = ensure_build_base(builder, base, wheelhouse)
    # The build base's name stands for it: it is made of the base's id and the wheels'
    # digest, and the same build base made again (another id) changes nothing.
    inputs = inputs_hash(image_id(builder, base), build_base)
    with _locked("build"):
        labels = image_labels(builder, image)
        if not force and labels is not None and labels.get(INPUTS_LABEL) == inputs:
            return describe(builder, image)
        # The local base brings tini, and the wheels are in the build base: no step needs a
        # network. Another base may need apt for tini, through this machine's network (not
        # a bridge buildah would make on the host).
        network = "none" if base == LOCAL_BASE else "host"
        say(f"building {image} with buildah on {base} (network {network})")
        bud = ["bud", "--runtime", builder.runtime, "--network", network, "--pull=never",
               "--layers=false", "--label", f"{INPUTS_LABEL}={inputs}",
               "--build-arg", f"PYTHON_IMAGE={base}", "--build-arg", f"BUILD_IMAGE={build_base}",
               "--tag", image, "--file", str(REPO / "Dockerfile")]
        if quiet:
            bud.append("--quiet")
        buildah(builder, *bud, REPO, what="buildah bud", capture=quiet, timeout=3600)
    return describe(builder, image, built=True, seconds=time.monotonic() - started)


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


# -- the pause image and the archives ------------------------------------------------------------


def ensure_pause(builder: Builder) -> str:
    """The pause image of the local cluster's node: Debian's catatonit in pause mode, alone in
    a scratch image, as uid 65535 (as the upstream pause image runs), named ``PAUSE_IMAGE``."""
    catatonit = _which("catatonit")
    if catatonit is None:
        subprocess.run([str(SYSTEM_PACKAGES), "image"], check=False, stdout=sys.stderr)
        catatonit = _which("catatonit")
    if catatonit is None:
        raise ImageError("the pause image is Debian's catatonit: install it "
                         "(apt-get install -y catatonit) and run make image-archive again")
    recipe = hashlib.sha256(Path(catatonit).read_bytes()).hexdigest()[:16]
    with _locked("pause"):
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
