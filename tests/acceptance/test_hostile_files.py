"""The filesystem boundary's rules (``jobfence.fsboundary``), fuzzed on the real filesystem
as root, as a worker runs: random trees of files, directories, symbolic links (to files and
directories outside, or inside), FIFOs, sockets and hard links (to the job's own files and to
a file outside) stand in a job's outputs, some of them changed between the listing and the
opening. Only the job's own regular files with one name are ever listed, only they are
opened, nothing outside is ever read, and opening never blocks on a FIFO. Input files are
created only inside their directory, whatever names and whatever the job planted there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobfence.fsboundary import (
    DIR_FLAGS,
    BoundaryError,
    create_file,
    list_files,
    open_listed,
    remove_dir,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root")

JOB = 1899000123
"""The job's uid here (outside the per-job range, no user has it)."""
OTHER = 1899000124
CANARY = b"outside: never to be read"

PATHS = st.builds(lambda folder, name: folder + name,
                  st.sampled_from(["", "", "d/", "d/e/", "f/"]),
                  st.sampled_from(["a", "b", "c", "x", "y", "d"]))
"""Leaves of a few folders (made as the job's when missing), so that most operations take."""
OPS = st.one_of(
    st.tuples(st.just("file"), PATHS, st.just(True)),       # the job's (most often)
    st.tuples(st.just("file"), PATHS, st.booleans()),       # the job's, or another user's
    st.tuples(st.just("dir"), PATHS),
    st.tuples(st.just("symlink"), PATHS, st.sampled_from(["file", "dir", "inside", ".."])),
    st.tuples(st.just("fifo"), PATHS),
    st.tuples(st.just("socket"), PATHS),
    st.tuples(st.just("hardlink"), PATHS, st.sampled_from(["outside", "inside"])),
)


@pytest.fixture
def place() -> Iterator[Path]:
    """A short path (a socket's name is at most 107 bytes) with ``out/`` (the job's) and
    ``outside/`` (a canary file and directory only root may read)."""
    root = Path(tempfile.mkdtemp(prefix="jf-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def fresh(root: Path) -> tuple[Path, Path]:
    for name in ("out", "outside"):
        shutil.rmtree(root / name, ignore_errors=True)
    out, outside = root / "out", root / "outside"
    out.mkdir()
    os.chown(out, JOB, JOB)
    outside.mkdir(mode=0o700)
    (outside / "secret").write_bytes(CANARY)
    (outside / "dir").mkdir()
    (outside / "dir" / "secret").write_bytes(CANARY)
    return out, outside


def build(out: Path, outside: Path, ops: list[tuple[object, ...]]) -> dict[str, bytes]:
    """Apply ``ops`` as the job (or another user) would; what each regular file holds."""
    contents: dict[str, bytes] = {}
    for i, op in enumerate(ops):
        kind, rel = str(op[0]), str(op[1])
        path = out / rel
        with contextlib.suppress(OSError):
            parent = out
            for part in Path(rel).parts[:-1]:  # parents as the job's directories
                parent = parent / part
                if not parent.is_symlink() and not parent.exists():
                    parent.mkdir()
                    os.chown(parent, JOB, JOB)
            if kind == "file":  # a new file: never through what is there already
                data = f"content {i} of {rel}".encode()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.chown(path, JOB if op[2] else OTHER, JOB)
                contents[rel] = data
            elif kind == "dir":
                path.mkdir()
                os.chown(path, JOB, JOB)
            elif kind == "symlink":
                target = {"file": outside / "secret", "dir": outside / "dir",
                          "inside": out / "a", "..": Path("..")}[str(op[2])]
                path.symlink_to(target)
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "socket":
                with socket.socket(socket.AF_UNIX) as s:
                    s.bind(str(path))
            elif kind == "hardlink":
                source = outside / "secret" if op[2] == "outside" else next(
                    (out / r for r in contents if (out / r).is_file()), outside / "secret")
                os.link(source, path)
    return contents


def expected_accepted(out: Path) -> set[str]:
    """Independently of the code under test: the job's regular files with one name,
    reached without following a link."""
    found = set()
    for top, dirs, files in os.walk(out):  # os.walk does not follow links to directories
        for name in (*dirs, *files):
            full = Path(top) / name
            st_ = full.lstat()
            if stat.S_ISREG(st_.st_mode) and st_.st_uid == JOB and st_.st_nlink == 1:
                found.add(str(full.relative_to(out)))
    return found


def spoil(out: Path, rel: str, how: str, outside: Path) -> None:
    """Change a listed file before it is opened, as a job still running might."""
    path = out / rel
    with contextlib.suppress(OSError):
        path.unlink()
        if how == "symlink":
            path.symlink_to(outside / "secret")
        elif how == "fifo":
            os.mkfifo(path)
        elif how == "other":
            path.write_bytes(CANARY)
            os.chown(path, OTHER, OTHER)
        elif how == "hardlink":
            os.link(outside / "secret", path)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=16),
       spoiled=st.lists(st.tuples(st.integers(0, 20),
                                  st.sampled_from(["symlink", "fifo", "other", "hardlink"])),
                        max_size=3))
def test_only_the_jobs_own_regular_files_are_listed_and_opened_and_nothing_outside_is_read(
        place: Path, ops: list[tuple[object, ...]], spoiled: list[tuple[int, str]]) -> None:
    out, outside = fresh(place)
    contents = build(out, outside, ops)
    fd = os.open(out, DIR_FLAGS)
    try:
        listed, refused = list_files(fd, JOB)
        assert {f.path for f in listed} == expected_accepted(out)
        assert not {f.path for f in listed} & {r.path for r in refused}
        for r in refused:  # every refusal names an entry that is there and why
            assert (out / r.path).is_symlink() or (out / r.path).exists(), r
            assert r.why, r
        spoilt = set()
        for index, how in spoiled:
            if listed:
                item = listed[index % len(listed)]
                spoil(out, item.path, how, outside)
                spoilt.add(item.path)
        for item in listed:
            opened = open_listed(fd, item, JOB)
            if isinstance(opened, str):
                assert item.path in spoilt, (item, opened)
                continue
            with opened:
                data = opened.read()
            assert data != CANARY and data == contents[item.path], item
    finally:
        os.close(fd)
    assert (outside / "secret").read_bytes() == CANARY


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rel=st.text(alphabet="ab./\0", max_size=12),
       planted=st.sampled_from(["nothing", "link to a directory", "link to a file", "file"]))
def test_an_input_file_is_created_only_inside_its_directory(
        place: Path, rel: str, planted: str) -> None:
    out, outside = fresh(place)
    shutil.rmtree(outside / "dir")
    (outside / "dir").mkdir()
    if planted == "link to a directory":
        (out / "a").symlink_to(outside / "dir")
    elif planted == "link to a file":
        (out / "a").symlink_to(outside / "secret")
    elif planted == "file":
        (out / "a").write_bytes(b"the job's")
    fd = os.open(out, DIR_FLAGS)
    try:
        try:
            f = create_file(fd, rel, owner=(JOB, JOB))
        except (BoundaryError, OSError):
            pass
        else:
            with f:
                f.write(b"input")
            made = [p for p in out.rglob("*") if p.is_file() and not p.is_symlink()
                    and p.read_bytes() == b"input"]
            assert len(made) == 1 and made[0].resolve().is_relative_to(out.resolve())
            assert made[0].lstat().st_uid == JOB
    finally:
        os.close(fd)
    assert list((outside / "dir").iterdir()) == []
    assert (outside / "secret").read_bytes() == CANARY


def test_a_space_is_removed_without_following_its_links(place: Path) -> None:
    out, outside = fresh(place)
    (out / "to-outside").symlink_to(outside)
    (out / "deep").mkdir()
    (out / "deep" / "closed").mkdir()
    (out / "deep" / "closed" / "f").write_text("x")
    (out / "deep" / "closed").chmod(0)  # a job may make its directories unreadable
    parent = os.open(place, DIR_FLAGS)
    fd = os.open(out, DIR_FLAGS)
    try:
        assert remove_dir(parent, "out", fd)
    finally:
        os.close(fd)
        os.close(parent)
    assert not out.exists()
    assert (outside / "secret").read_bytes() == CANARY and (outside / "dir" / "secret").exists()
