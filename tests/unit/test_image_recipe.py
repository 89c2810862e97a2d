"""What `make image` decides before it runs a builder: the Debian mirror of the local base
(the one this machine's apt uses, in either format of sources), the wheels' platform tags,
the requirements the offline build resolves, and the inputs' hash that decides whether an
image is up to date."""

from __future__ import annotations

import tomllib
from pathlib import Path

from devtools import image
from tests.support import REPO


def sources(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "apt"
    (root / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_the_mirror_is_the_one_apt_uses_in_deb822(tmp_path: Path) -> None:
    root = sources(tmp_path, {"sources.list.d/debian.sources": (
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\n"
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"),
        "sources.list.d/other.list": "deb https://packages.example/apt stable main\n"})
    assert image.apt_mirror(root) == image.Mirror("http://mirror.example/debian",
                                                  "http://mirror.example/debian-security")


def test_the_mirror_in_one_line_sources(tmp_path: Path) -> None:
    root = sources(tmp_path, {"sources.list": (
        "# a comment\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://m.example/debian bookworm main\n"
        "deb http://s.example/debian-security bookworm-security main\n")})
    assert image.apt_mirror(root) == image.Mirror("http://m.example/debian",
                                                  "http://s.example/debian-security")


def test_no_debian_source_falls_back_to_debians_own(tmp_path: Path) -> None:
    root = sources(tmp_path, {"sources.list": "deb http://archive.example/ubuntu noble main\n"})
    mirror = image.apt_mirror(root)
    assert mirror.debian == "http://deb.debian.org/debian"
    assert mirror.security == "http://deb.debian.org/debian-security"


def test_a_changed_recipe_changes_the_bases_hash() -> None:
    one = image.Mirror("http://a.example/debian", "http://a.example/debian-security")
    other = image.Mirror("http://b.example/debian", "http://a.example/debian-security")
    assert image.base_recipe(one) == image.base_recipe(one) != image.base_recipe(other)


def test_the_wheels_platforms_reach_back_to_the_oldest_manylinux() -> None:
    tags = image.platforms("x86_64", 36)
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert not any("2_37" in t for t in tags)


def test_the_offline_build_resolves_what_the_dockerfile_asks() -> None:
    """`pip wheel ".[otel]"`: the dependencies, the otel extra, and the build system (built
    in isolation from the same wheels)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = (project["build-system"]["requires"] + project["project"]["dependencies"]
              + project["project"]["optional-dependencies"]["otel"])
    assert image.requirements() == wanted
    assert "RUN pip wheel --wheel-dir /wheels \".[otel]\"" in (REPO / "Dockerfile").read_text()


def test_the_inputs_hash_follows_the_bases() -> None:
    assert image.inputs_hash("base-a") == image.inputs_hash("base-a")
    assert image.inputs_hash("base-a") != image.inputs_hash("base-b")
