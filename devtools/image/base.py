"""The local Python base, where ``python:3.11-slim`` cannot be pulled: Debian bookworm by
``debootstrap --variant=minbase`` from this machine's own apt mirror, with python3, pip,
venv, ca-certificates and tini, upgraded, trimmed as Debian's slim images are, without
``EXTERNALLY-MANAGED``; committed as ``localhost/jobfence-python:3.11`` with its recipe's
hash as a label, and rebuilt only when that changes."""

from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from pathlib import Path

from devtools.image.common import (
    LOCAL_BASE,
    RECIPE_LABEL,
    SYSTEM_PACKAGES,
    Builder,
    ImageError,
    buildah,
    cache_root,
    du,
    image_labels,
    locked,
    run,
    say,
    which,
)

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


def _unmount_under(root: Path) -> None:
    """debootstrap mounts /proc and /sys into the tree it makes and leaves them mounted when
    it fails half-way: unmount them before the tree is removed."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{root}/")), reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def ensure_base(builder: Builder, *, force: bool = False) -> str:
    """The local base ``localhost/jobfence-python:3.11``, built unless an image of the same
    recipe is there; its name."""
    if builder.kind != "buildah":
        raise ImageError("the local Python base is built with buildah: install buildah and "
                         "runc (apt-get install -y buildah runc debootstrap)")
    mirror = apt_mirror()
    recipe = base_recipe(mirror)
    with locked("base"):
        labels = image_labels(builder, LOCAL_BASE)
        if not force and labels is not None and labels.get(RECIPE_LABEL) == recipe:
            return LOCAL_BASE
        if os.geteuid() != 0:
            raise ImageError("the local Python base is made with debootstrap and chroot, as "
                             "root: run make base-image as root")
        if not which("debootstrap"):
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
            try:
                _make_rootfs(root, mirror)
            finally:
                _unmount_under(root)
            size = du(root)
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
