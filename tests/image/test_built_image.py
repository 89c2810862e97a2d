"""The one image, built (`make image`: buildah where no Docker engine answers, on the local
Debian base where python:3.11-slim cannot be pulled) and run: tini is its entrypoint and
starts `jobfence`, it runs as the numeric uid 10001 and carries the jobs' user 10002, it has
no compiler and no build leftovers, its Python imports jobfence with the `otel` extra, a
rebuild of the same inputs builds nothing, and it and the pause image leave as archives
containerd imports. `make image` with no builder says in one line what to install.

The image is built once per set of inputs (the session fixture ``built_image``): the first
build on a machine takes minutes (the base, the wheels), later sessions find it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from devtools import image
from jobfence.commands import COMMANDS
from tests.support import REPO

# A first build makes the local base (minutes on two busy cores) before the image.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def builder() -> image.Builder:
    return image.find_builder()


def run_in(builder: image.Builder, built: image.Built, *argv: str,
           user: str | None = None) -> str:
    out = image.run_in(builder, built.name, argv, user=user)
    assert out.returncode == 0, (argv, out.stdout[-2000:], out.stderr[-2000:])
    return out.stdout


def config(builder: image.Builder, name: str) -> dict[str, object]:
    if builder.kind == "docker":
        out = image.run([builder.program, "image", "inspect", name], what="inspect")
        return {k.lower(): v for k, v in json.loads(out)[0]["Config"].items()}
    out = image.run([builder.program, "inspect", "--type", "image", name], what="inspect")
    return {k.lower(): v for k, v in json.loads(out)["OCIv1"]["config"].items()}


def test_tini_starts_jobfence_as_the_numeric_non_root_user(
        builder: image.Builder, built_image: image.Built) -> None:
    cfg = config(builder, built_image.name)
    assert cfg["entrypoint"] == ["/usr/bin/tini", "--", "jobfence"]
    assert cfg["user"] == "10001:10001"  # numeric: runAsNonRoot checks it without /etc/passwd
    # The entrypoint as the image has it, with its default arguments.
    shown = run_in(builder, built_image, *cfg["entrypoint"], *cfg["cmd"])  # type: ignore[misc]
    listed = {line.split()[0] for line in shown.splitlines() if line.startswith("  ")}
    assert listed == set(COMMANDS)
    assert run_in(builder, built_image, "jobfence", "--version").split() == \
        ["jobfence", image.VERSION]
    assert run_in(builder, built_image, "id", "-u").strip() == "10001"
    assert run_in(builder, built_image, "id", "-g").strip() == "10001"


def test_the_jobs_user_is_there_apart_from_the_workers(
        builder: image.Builder, built_image: image.Built) -> None:
    """The command sidecar runs a job's commands as 10002 (jobfence-jobs), never as the
    worker's uid; both log in nowhere."""
    passwd = run_in(builder, built_image, "getent", "passwd", "10001", "10002").splitlines()
    entries = {int(line.split(":")[2]): line.split(":") for line in passwd}
    assert entries[10001][0] == "jobfence" and entries[10002][0] == "jobfence-jobs"
    assert entries[10002][3] == "10002"
    assert {e[6] for e in entries.values()} == {"/usr/sbin/nologin"}
    assert run_in(builder, built_image, "id", "-u", user="10002:10002").strip() == "10002"


def test_no_compiler_sources_wheels_or_caches_in_the_image(
        builder: image.Builder, built_image: image.Built) -> None:
    probe = ("for p in gcc cc c++ g++ clang make ld as; do command -v $p; done; "
             "for d in /src /wheels /wheelhouse /root/.cache/pip /tmp/.cache; do "
             "[ -e $d ] && echo $d; done; "
             "ls /usr/lib/python3*/EXTERNALLY-MANAGED 2>/dev/null; true")
    assert run_in(builder, built_image, "sh", "-c", probe, user="0:0").split() == []


def test_its_python_imports_jobfence_with_the_otel_extra(
        builder: image.Builder, built_image: image.Built) -> None:
    code = ("import jobfence, jobfence.functions.worker, jobfence.adapters.kube, "
            "opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter, "
            "kubernetes.client, boto3, psycopg; "
            "from importlib.metadata import version; "
            "print(version('jobfence'), psycopg.pq.__impl__)")
    shown = run_in(builder, built_image, "python", "-c", code).split()
    assert shown == [image.VERSION, "binary"]  # psycopg[binary]: nothing built against libpq
    # Every installed distribution has what it requires.
    run_in(builder, built_image, "python", "-m", "pip", "check")


def test_it_is_slim(builder: image.Builder, built_image: image.Built) -> None:
    """The local base is trimmed and the unused asyncio copy of the kubernetes client left
    out: on it, the image stays under 300 MB (it was 407 MB before)."""
    gone = "import importlib.util as u; print(u.find_spec('kubernetes.aio'))"
    assert run_in(builder, built_image, "python", "-c", gone).strip() == "None"
    assert len(built_image.layers) >= 2  # the base's, then jobfence's
    labels = image.image_labels(builder, built_image.name) or {}
    if image.RECIPE_LABEL not in labels:  # the local base's label, inherited
        pytest.skip(f"built on another base ({built_image.line()})")
    assert built_image.size <= 300e6, built_image.line()


def test_a_build_of_the_same_inputs_builds_nothing(built_image: image.Built) -> None:
    started = time.monotonic()
    again = image.build(built_image.name, quiet=True)
    assert not again.built and again.id == built_image.id
    assert time.monotonic() - started < 60


def test_the_image_and_the_pause_image_leave_as_archives_containerd_imports(
        builder: image.Builder, built_image: image.Built, tmp_path: Path) -> None:
    if builder.kind != "buildah":
        pytest.skip("the pause image is made with buildah")
    pause = image.ensure_pause(builder)
    cfg = config(builder, pause)
    assert cfg["entrypoint"] == ["/catatonit", "-P"] and cfg["user"] == "65535:65535"
    for name in (built_image.name, pause):
        target = image.export(builder, name, tmp_path / "out.tar")
        with tarfile.open(target) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
            [entry] = manifest
            assert entry["RepoTags"] == [name]
            assert len(entry["Layers"]) >= 1 and all(n in tar.getnames() for n in entry["Layers"])
        target.unlink()


def test_make_image_with_no_builder_says_what_to_install(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER": str(tmp_path / "docker"), "BUILDAH": str(tmp_path / "buildah")}
    out = subprocess.run([sys.executable, "-m", "devtools.image", "build"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2
    [line] = out.stderr.splitlines()
    assert line.startswith("image: no container builder here: install buildah and runc"), line
    assert "Docker engine" in line
