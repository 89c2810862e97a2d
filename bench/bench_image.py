"""The one image: its size by layer, and what building it costs (``python -m bench.run
--only image``).

* **base**: ``make base-image`` from nothing (debootstrap from this machine's apt mirror,
  the security suite's updates, the trim, the commit) — skipped with ``--quick``, where the
  base already built is reported instead;
* **cold build**: no wheels downloaded yet, no build base, the base there: what a first
  ``make image`` on a machine with the base pays;
* **warm build**: the wheels and the build base cached, the sources changed (a forced
  build): what a ``make image`` after an edit pays;
* **up to date**: the same inputs again: the hash of the inputs finds the image.

The builds go to a name of their own (``localhost/jobfence:bench``, untagged at the end), the
wheels to a cache of their own, so what ``make image`` built stays.
"""

from __future__ import annotations

import os
import tempfile
import time

from bench.common import Bench, Section
from devtools import image

TAG = "localhost/jobfence:bench"


def _layers(builder: image.Builder, base: str, built: image.Built) -> list[list[str]]:
    """The image's layers named by what made them: the base's own, then the final stage's
    one (buildah without ``--layers`` commits a stage's steps as one layer, and its history
    names that layer by the stage's last instruction, not by its RUN)."""
    of_base = len(image.describe(builder, base).layers)
    rows = []
    for n, (size, _) in enumerate(built.layers, 1):
        what = (f"the base `{base}`" if n <= of_base else
                "the final stage: `pip install jobfence[otel]` from the build stage's wheels, "
                "the users 10001 and 10002 (tini comes with the base)")
        rows.append([f"layer {n}", "", f"{size / 1e6:.1f} MB", what])
    return rows


def run(bench: Bench) -> Section:
    s = Section("The image: size by layer, build times", "python -m bench.run --only image",
                ["what", "time", "size", "detail"])
    builder = image.find_builder()
    load_before = os.getloadavg()[0]
    if builder.kind != "buildah":
        s.notes.append(f"Skipped: a Docker engine answers here, and these figures are "
                       f"buildah's ({builder.program}).")
        return s
    if bench.quick:
        base = image.ensure_base(builder)
        s.rows.append(["local base (cached; not rebuilt with --quick)", "—",
                       f"{image.describe(builder, base).size / 1e6:.0f} MB", base])
    else:
        started = time.monotonic()
        base = image.ensure_base(builder, force=True)
        s.rows.append(["local base from nothing (`make base-image`)",
                       f"{time.monotonic() - started:.0f} s",
                       f"{image.describe(builder, base).size / 1e6:.0f} MB",
                       f"Debian bookworm minbase + {', '.join(image.BASE_PACKAGES)}, "
                       "upgraded, trimmed"])
    saved = os.environ.get("JOBFENCE_IMAGE_CACHE")
    with tempfile.TemporaryDirectory(prefix="jobfence-bench-image-") as cache:
        os.environ["JOBFENCE_IMAGE_CACHE"] = cache
        try:
            # Cold: no wheels (an empty cache), no build base made of them.
            build_base = image.build_base_name(builder, base, image.wheelhouse_digest())
            if image.image_labels(builder, build_base) is not None:
                image.buildah(builder, "rmi", build_base, what="buildah rmi")
            cold = image.build(TAG, python_image=base, force=True, quiet=True)
            s.rows.append(["cold build (the wheels downloaded, the build base made)",
                           f"{cold.seconds:.0f} s", f"{cold.size / 1e6:.0f} MB", cold.digest])
            warm = image.build(TAG, python_image=base, force=True, quiet=True)
            s.rows.append(["warm build (wheels and build base cached; sources changed)",
                           f"{warm.seconds:.0f} s", f"{warm.size / 1e6:.0f} MB", warm.digest])
            started = time.monotonic()
            same = image.build(TAG, python_image=base, quiet=True)
            assert not same.built and same.id == warm.id, same
            s.rows.append(["up to date (same inputs: nothing built)",
                           f"{time.monotonic() - started:.1f} s", "", ""])
        finally:
            # The builds stay under their cache tag (make image finds the last one); the
            # bench's own name goes.
            if image.image_labels(builder, TAG) is not None:
                image.buildah(builder, "rmi", TAG, what=f"untagging {TAG}")
            if saved is None:
                os.environ.pop("JOBFENCE_IMAGE_CACHE", None)
            else:
                os.environ["JOBFENCE_IMAGE_CACHE"] = saved
    s.rows += _layers(builder, base, warm)
    s.notes.append(
        f"`buildah bud` (Debian's buildah {_buildah_version(builder)}, runc) of the "
        "repository's Dockerfile on the local base, with no network inside the builder: the "
        "dependencies' wheels are downloaded on the host (`pip download` for CPython 3.11, "
        "manylinux) and carried by the build base. Sizes are uncompressed layer sizes from "
        "the image's manifest. On a machine shared with other work (Go builds), the times "
        f"move from run to run: the 1-minute load average was {load_before:.1f} at the start "
        f"and {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores.")
    return s


def _buildah_version(builder: image.Builder) -> str:
    out = image.run([builder.program, "--version"], what="buildah --version")
    return out.split()[2] if len(out.split()) > 2 else out.strip()
