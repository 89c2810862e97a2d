"""The worker's log of a command's output (``jobfence.worker.output``): whole lines, however
the pipe cut them; a line too long in pieces; the per-second budget, with every line either
said or counted."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobfence.actions.child import Usage
from jobfence.logs import configure
from jobfence.worker.output import LINE_BYTES, LineBudget, Origin, Output


def _said(err: str, event: str) -> list[dict[str, object]]:
    return [e for e in map(json.loads, filter(None, err.splitlines())) if e["event"] == event]


def _run(chunks: list[bytes], budget: LineBudget) -> Output:
    out = Output(Origin(uuid.uuid4(), uuid.uuid4(), 1, 0), lines=budget, target=None)
    for chunk in chunks:
        out.add("out", chunk)
    out.close()
    return out


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(st.characters(blacklist_characters="\n\r", codec="utf-8"),
                        max_size=40), max_size=30),
       st.booleans(), st.lists(st.integers(1, 50), min_size=1, max_size=20))
def test_lines_come_out_whole_however_the_pipe_cut_them(
        capsys: pytest.CaptureFixture[str], lines: list[str], ends: bool,
        cuts: list[int]) -> None:
    configure("json")
    data = "\n".join(lines).encode() + (b"\n" if ends and lines else b"")
    chunks, at, i = [], 0, 0
    while at < len(data):
        chunks.append(data[at:at + cuts[i % len(cuts)]])
        at += cuts[i % len(cuts)]
        i += 1
    capsys.readouterr()
    _run(chunks, LineBudget(1e9))
    said = [str(e["line"]) for e in _said(capsys.readouterr().err, "output")]
    expected = data.decode().split("\n")
    if expected and expected[-1] == "":
        expected.pop()
    assert said == expected


def test_a_long_line_is_said_in_pieces(capsys: pytest.CaptureFixture[str]) -> None:
    configure("json")
    capsys.readouterr()
    _run([b"a" * (LINE_BYTES * 2 + 10), b"\nshort\n"], LineBudget(1e9))
    said = _said(capsys.readouterr().err, "output")
    assert [(len(str(e["line"])), e.get("cut")) for e in said] == [
        (LINE_BYTES, True), (LINE_BYTES, True), (10, True), (5, None)]


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 300), st.integers(1, 120))
def test_every_line_is_said_or_counted_within_the_budget(
        capsys: pytest.CaptureFixture[str], lines: int, per_second: int) -> None:
    configure("json")
    capsys.readouterr()
    _run([b"x\n" * lines], LineBudget(per_second, clock=lambda: 7.0))
    err = capsys.readouterr().err
    said = len(_said(err, "output"))
    dropped = sum(int(str(e["lines"])) for e in _said(err, "output_lines_dropped"))
    assert said == min(lines, per_second) and said + dropped == lines


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=20), inner, max_size=3), max_leaves=8)
       | st.fixed_dictionaries({"cpu_seconds": st.floats() | st.integers() | st.text(),
                                "peak_memory_bytes": st.none() | st.integers() | st.floats()}))
def test_a_reported_usage_is_a_usage_or_nothing(said: object) -> None:
    """What the command sidecar reports with an exit is read strictly, whatever it is."""
    used = Usage.reported(said)
    if used is not None:
        assert 0 <= used.cpu_seconds < 1e9
        assert used.peak_memory_bytes is None or 0 <= used.peak_memory_bytes < 1 << 50
        assert Usage.reported(used.as_dict()) is not None


@given(st.text())
def test_what_a_person_is_shown_holds_no_control_character(text: str) -> None:
    from jobfence.terminal import harmless

    shown = harmless(text)
    assert not any((ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) < 0xA0 for c in shown)
    assert harmless(shown) == shown and harmless("a\tb\nc") == "a\tb\nc"
