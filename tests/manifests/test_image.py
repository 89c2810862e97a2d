"""The image and the wheel. The Dockerfile builds on a slim Python in two stages, its final
stage runs `jobfence` as a numeric non-root user (the uid the pods run as) with no build
tools, no sources and no wheel files; the build context lets in what the build copies. No
Docker engine runs here, so the image itself is not built: instead the wheel is built from
exactly the files the build stage copies and installed into a clean virtualenv, as the
final stage does, and its `jobfence` must list and start every command and carry the SQL
and the migrations; an application beside it type-checks against its API."""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jobfence.functions.cli import COMMANDS
from tests.support.kube import outside
from tests.support.manifests import REPO, Obj, pod_templates

BASE_IMAGE = "python:3.11-slim"
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|make|build-essential|libpq-dev|python3-dev|cc)\b")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, rest) per instruction: comments dropped, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), " ".join(rest.split())))
    return out


def stages(text: str) -> list[Stage]:
    args: dict[str, str] = {}
    found: list[Stage] = []
    for keyword, rest in instructions(text):
        if keyword == "ARG" and not found:
            name, _, default = rest.partition("=")
            args[name] = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], default)
        elif keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(base, name))
        else:
            found[-1].instructions.append((keyword, rest))
    return found


@pytest.fixture(scope="module")
def dockerfile() -> list[Stage]:
    return stages((REPO / "Dockerfile").read_text())


def build_sources(build: Stage) -> list[str]:
    """What the build stage copies from the context."""
    sources = []
    for rest in build.args("COPY"):
        words = [w for w in rest.split() if not w.startswith("--")]
        sources += words[:-1]
    return sources


def test_two_stages_on_a_slim_python(dockerfile: list[Stage]) -> None:
    assert len(dockerfile) >= 2
    assert {s.base for s in dockerfile} == {BASE_IMAGE}
    assert dockerfile[0].name == "build"


def test_final_stage_runs_jobfence_as_a_numeric_non_root_user(dockerfile: list[Stage],
                                                             base: list[Obj]) -> None:
    final = dockerfile[-1]
    # A small init as PID 1: signals reach jobfence, orphans of a job's command are reaped.
    assert json.loads(final.args("ENTRYPOINT")[-1]) == ["/usr/bin/tini", "--", "jobfence"]
    assert any("install" in run and " tini" in run for run in final.args("RUN"))
    [user] = final.args("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))
    env = " ".join(final.args("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "PYTHONUNBUFFERED=1" in env
    # The pods ask for the same user the image runs as.
    for where, template in pod_templates(base):
        assert template["spec"]["securityContext"]["runAsUser"] == int(uid), where


def test_final_stage_has_no_build_tools_sources_or_wheels(dockerfile: list[Stage]) -> None:
    final = dockerfile[-1]
    for rest in final.args("RUN"):
        if "install" in rest and ("apt-get" in rest or "apk" in rest):
            assert not BUILD_TOOLS.search(rest), rest
        assert "/wheels" not in rest or "--mount=type=bind,from=build" in rest, rest
    assert not final.args("COPY") and not final.args("ADD")
    assert "pip wheel" in " ".join(dockerfile[0].args("RUN"))


def test_a_team_image_builds_on_jobfence_and_keeps_its_user_and_entrypoint(
        dockerfile: list[Stage]) -> None:
    """The example of a pool's own image (manifests/README.md): FROM the jobfence image,
    back to jobfence's user after installing as root, the entrypoint left alone."""
    [team] = stages((REPO / "examples" / "team-image" / "Dockerfile").read_text())
    assert re.fullmatch(r"[\w./-]+/jobfence:[\w.]+", team.base), team.base
    users = team.args("USER")
    assert users and users[-1] == dockerfile[-1].args("USER")[-1]
    assert not team.args("ENTRYPOINT") and not team.args("CMD")


def ignored(name: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves a top-level name out of the context (last match wins)."""
    out = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        if fnmatch.fnmatchcase(name, pattern.lstrip("!").rstrip("/")):
            out = not negate
    return out


def test_the_build_context_holds_what_the_build_copies(dockerfile: list[Stage]) -> None:
    patterns = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    sources = build_sources(dockerfile[0])
    assert set(sources) == {"pyproject.toml", "README.md", "shared", "functions"}
    for source in sources:
        assert not ignored(source, patterns), source
    for name in (".venv", ".git", "tests", "manifests", "bench", "build"):
        assert ignored(name, patterns), name


def make_wheel(root: Path, name: str) -> Path:
    """A tiny unrelated distribution whose import package is ``name``, as the wheel its
    build would make (written here: building it would only repeat setuptools' work)."""
    dist_info = f"app_{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": f"OWNER = 'the application'\nNAME = {name!r}\n",
             f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: app-{name}\nVersion: 1.0\n",
             f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: jobfence-tests\n"
                                   "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={_digest(text.encode())},{len(text.encode())}"
              for path, text in files.items()]
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    root.mkdir(parents=True, exist_ok=True)
    wheel = root / f"app_{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


EVERY_HELP = """
import contextlib, io, json
from jobfence.functions.cli import COMMANDS, main
out = {}
for command in COMMANDS:
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        try:
            code = main([command, "--help"])
        except SystemExit as exc:
            code = exc.code
    out[command] = [code, shown.getvalue()]
print(json.dumps(out))
"""


def test_the_wheel_is_one_package_that_never_touches_an_applications_own(
        dockerfile: list[Stage], tmp_path: Path) -> None:
    """`pip install jobfence` into an application's environment that already has packages
    named `shared` and `functions`: both keep working, with jobfence installed and after it
    is uninstalled; the wheel puts nothing at the top of site-packages but `jobfence`."""
    src = tmp_path / "src"
    src.mkdir()
    for source in build_sources(dockerfile[0]):
        path = REPO / source
        if path.is_dir():
            shutil.copytree(path, src / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / source)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JOBFENCE_", "PYTHON", "VIRTUAL_ENV"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(a) for a in argv], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, (argv, out.stdout[-2000:], out.stderr[-2000:])
        return out

    # Its build dependencies come from the package index: outside the test cluster's network.
    run(*outside(), sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir",
        tmp_path / "dist", src)
    [wheel] = (tmp_path / "dist").glob("jobfence-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    version = wheel.name.split("-")[1]
    assert {n.split("/")[0] for n in names} == {"jobfence", f"jobfence-{version}.dist-info"}
    store_sql = {f"jobfence/store/{p.name}" for p in (REPO / "shared" / "store").glob("*.sql")}
    migrations = {f"jobfence/store/schema/{p.name}"
                  for p in (REPO / "shared" / "store" / "schema").glob("*.sql")}
    assert store_sql and migrations and store_sql | migrations <= names
    assert "jobfence/py.typed" in names
    assert not any(n.startswith(("jobfence/devtools", "devtools/", "tests/")) for n in names)

    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    pip = [*outside(), sys.executable, "-m", "pip", "--python", python]
    # The application's environment; this pip installs into it (--python), as its own would.
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    run(*pip, "install", "--quiet", "--no-compile",
        *(make_wheel(tmp_path / "apps", name) for name in ("shared", "functions")))
    theirs = "import shared, functions; assert shared.OWNER == functions.OWNER == " \
             "'the application', (shared.__file__, functions.__file__)"
    run(python, "-c", theirs)
    run(*pip, "install", "--quiet", "--no-compile", wheel)  # no bytecode: not what is tested
    run(python, "-c", theirs)
    run(python, "-c", "import jobfence, jobfence.store, jobfence.functions.worker")
    shown = run(venv / "bin" / "jobfence", "--help").stdout
    listed = {line.split()[0] for line in shown.splitlines() if line.startswith("  ")}
    assert listed == set(COMMANDS)
    # Every command's module imports from the installed wheel and shows its help (in one
    # process: a process per command would only repeat the interpreter's start).
    helps = json.loads(run(python, "-c", EVERY_HELP).stdout)
    assert set(helps) == set(COMMANDS)
    for command, (code, text) in helps.items():
        assert code == 0 and command in text, (command, code, text[-500:])
    assert "worker" in run(python, "-m", "jobfence.functions.worker", "--help").stdout
    # An application beside it, typed against the installed API: the example service
    # (its pool is one of jobfence's dependencies) passes mypy --strict.
    example = tmp_path / "application"
    example.mkdir()
    shutil.copy2(REPO / "examples" / "maintenance_service" / "app.py", example / "app.py")
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--python-executable", str(python), "app.py"],
        cwd=example, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert checked.returncode == 0, checked.stdout[-3000:]
    run(*pip, "uninstall", "--yes", "jobfence")
    run(python, "-c", theirs)
