"""The snooze's pieces without a database: ``Snooze``'s bounds; the delay a command's snooze
file holds, parsed strictly (fuzzed: whatever the job writes, a delay within bounds or a
ValueError, never anything else); the file read through the space's descriptors, refusing
a link, a FIFO, a longer file or another user's; the command sidecar's ``read`` request
checked, and its reply."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.actions import MAX_SNOOZE, MIN_SNOOZE, Snooze
from jobfence.actions.snooze import MAX_FILE_BYTES, asked, file_name, parse_delay
from jobfence.fsboundary import DIR_FLAGS, BoundaryError, read_small
from jobfence.worker.sidecar.protocol import (
    MAX_READ_BYTES,
    ProtocolError,
    parse_request,
    read_reply,
)

FUZZ = settings(max_examples=500, derandomize=True, deadline=None, database=None)
ATTEMPT = "01a20000-0000-7000-8000-000000000000"


@pytest.mark.parametrize(("given_", "seconds"), [
    (30, 30.0), (0.5, 0.5), (timedelta(hours=2), 7200.0), (86_400, 86_400.0)])
def test_snooze_takes_seconds_or_a_timedelta(given_: float | timedelta, seconds: float) -> None:
    assert Snooze(given_).delay == timedelta(seconds=seconds)


@pytest.mark.parametrize("bad", [0, -1, 86_401, float("nan"), float("inf"), True, "30",
                                 None, timedelta(0), timedelta(days=2)])
def test_snooze_refuses_a_delay_out_of_bounds(bad: object) -> None:
    with pytest.raises(ValueError, match="from a millisecond to a day"):
        Snooze(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("data", "seconds"), [
    (b"90", 90), (b"90\n", 90), (b"  2.5  ", 2.5), (b".5", 0.5), (b"PT90S", 90),
    (b"pt1h30m\n", 5400), (b"P1D", 86_400), (b"86400", 86_400), (b"0.001", 0.001)])
def test_a_snooze_file_holds_seconds_or_an_iso_duration(data: bytes, seconds: float) -> None:
    assert parse_delay(data) == timedelta(seconds=seconds)


@pytest.mark.parametrize("data", [
    b"", b"\n", b"0", b"-5", b"+5", b"1e3", b"nan", b"inf", b"1_000", b"90s", b"PT0S",
    b"P2D", b"86401", b"P", b"PT", b"\xff\xfe", b"\x009", b"9\x00", b"\xd9\xa3",
    "\u0669".encode(), b"1" * 13, b"P99999999999999999D"])
def test_anything_else_in_a_snooze_file_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_delay(data)


@FUZZ
@given(st.binary(max_size=MAX_FILE_BYTES))
def test_whatever_a_job_writes_is_a_delay_in_bounds_or_a_value_error(data: bytes) -> None:
    try:
        delay = parse_delay(data)
    except ValueError as exc:
        assert len(str(exc)) < 300  # it never echoes the whole file
        return
    assert MIN_SNOOZE <= delay <= MAX_SNOOZE


@FUZZ
@given(st.floats(min_value=0.001, max_value=86_400, allow_nan=False),
       st.sampled_from(["{}", " {}\n", "{}\r\n"]))
def test_seconds_written_as_a_number_are_read_back(seconds: float, form: str) -> None:
    text = f"{seconds:.3f}"
    delay = parse_delay(form.format(text).encode())
    assert delay == timedelta(seconds=float(text))


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, DIR_FLAGS)
    yield fd
    os.close(fd)


def test_read_small_reads_a_regular_file_of_the_jobs(tmp_path: Path, workdir: int) -> None:
    (tmp_path / "note").write_bytes(b"PT5S")
    assert read_small(workdir, "note", os.geteuid(), 100) == b"PT5S"
    assert read_small(workdir, "missing", os.geteuid(), 100) is None


def test_read_small_refuses_what_is_not_a_small_regular_file_of_the_jobs(
        tmp_path: Path, workdir: int) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"30")
    (tmp_path / "link").symlink_to(secret)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "huge").write_bytes(b"1" * 10_000)
    (tmp_path / "dir").mkdir()
    os.link(secret, tmp_path / "second-name")
    uid = os.geteuid()
    for name, why in [("link", "symbolic link"), ("dangling", "symbolic link"),
                      ("fifo", "FIFO"), ("huge", "longer than 100 bytes"),
                      ("dir", "not a regular file"), ("second-name", "hard link")]:
        with pytest.raises(BoundaryError, match=why):
            read_small(workdir, name, uid, 100)
    (tmp_path / "theirs").write_bytes(b"30")
    with pytest.raises(BoundaryError, match="owned by uid"):
        read_small(workdir, "theirs", uid + 1, 100)
    for name in ("", ".", "..", "a/b", "x\0"):
        with pytest.raises(BoundaryError):
            read_small(workdir, name, uid, 100)


class FakeSpace:
    def __init__(self, got: bytes | Exception | None) -> None:
        self.got = got
        self.asked: list[tuple[str, int]] = []

    def read_file(self, name: str, limit: int) -> bytes | None:
        self.asked.append((name, limit))
        if isinstance(self.got, Exception):
            raise self.got
        return self.got


def test_asked_raises_the_snooze_its_file_asks_for_or_says_why_not() -> None:
    space = FakeSpace(b"PT2M\n")
    with pytest.raises(Snooze) as raised:
        asked(space, 3)  # type: ignore[arg-type]
    assert raised.value.delay == timedelta(minutes=2)
    assert space.asked == [(file_name(3), MAX_FILE_BYTES)] == [(".jobfence-snooze-3", 100)]
    assert asked(FakeSpace(None), 0) == "it wrote no delay into $JOBFENCE_SNOOZE_FILE"  # type: ignore[arg-type]
    assert "is not a delay" in asked(FakeSpace(b"soon"), 0)  # type: ignore[arg-type]
    assert asked(FakeSpace(BoundaryError("x: a FIFO")), 0) == (  # type: ignore[arg-type]
        "its snooze file was refused: x: a FIFO")


def test_the_sidecar_read_request_is_checked() -> None:
    kind, args = parse_request({"read": {"attempt": ATTEMPT, "name": ".jobfence-snooze-0",
                                         "limit": 100}})
    assert (kind, args["name"], args["limit"]) == ("read", ".jobfence-snooze-0", 100)
    for name, limit in [("a/b", 100), ("..", 100), ("", 100), ("x\0", 100), ("n", 0),
                        ("n", MAX_READ_BYTES + 1), ("n", True), ("n", "100"), (7, 100)]:
        with pytest.raises(ProtocolError):
            parse_request({"read": {"attempt": ATTEMPT, "name": name, "limit": limit}})
    with pytest.raises(ProtocolError):
        parse_request({"read": {"attempt": ATTEMPT, "name": "n"}})


def test_the_sidecar_read_reply_is_checked() -> None:
    assert read_reply({"read": None}, 10) is None
    assert read_reply({"read": base64.b64encode(b"30").decode()}, 10) == b"30"
    for bad in [{}, {"read": 5}, {"read": "not base64!"},
                {"read": base64.b64encode(b"x" * 11).decode()}]:
        with pytest.raises(ProtocolError):
            read_reply(bad, 10)
