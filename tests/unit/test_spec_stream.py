"""A spec list read as a stream (``jobfence.spec_stream``): whatever the text and however it
arrives in pieces, the specs read are exactly those ``json.loads`` reads from the whole text,
or the text is refused with ``InvalidSpec`` — never another exception; and the shortcut that
skips walking a spec never passes one the walk would refuse (hypothesis, a fixed seed)."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence import spec_stream
from jobfence.errors import InvalidSpec
from jobfence.limits import MAX_DEPTH, Unstorable, check_structure
from jobfence.spec_stream import _plainly_storable, spec_batches, spec_items
from tests.support.fuzz import ANY_TEXT, JSONISH

FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None)

SPEC = {"actions": [{"name": "sleep", "params": {"seconds": 0}}]}


class Trickle(io.RawIOBase):
    """A stream that hands out at most ``piece`` bytes a read, as a pipe may."""

    def __init__(self, data: bytes, piece: int) -> None:
        self.data, self.piece, self.at = data, piece, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        n = self.piece if size < 0 else min(size, self.piece)
        out = self.data[self.at:self.at + n]
        self.at += len(out)
        return out


def read(text: str | bytes, piece: int = 1 << 20) -> list[tuple[str, object]]:
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return [(where, item) for where, item, _ in spec_items(Trickle(data, piece))]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read in chunks of a few bytes, so that every spec straddles several."""
    monkeypatch.setattr(spec_stream, "CHUNK", 7)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=20)
SPACE = st.text(" \t\r\n", max_size=3)


@FUZZ
@given(st.lists(st.dictionaries(ANY_TEXT, JSON_VALUES, max_size=4), min_size=1, max_size=6),
       SPACE, st.integers(1, 40), st.booleans())
def test_a_list_read_in_pieces_is_the_list_json_reads(items: list[dict[str, Any]], space: str,
                                                       piece: int, lines: bool) -> None:
    if lines:  # JSON Lines: one object after another
        text = "".join(space + json.dumps(i) + "\n" for i in items)
    else:
        text = space + "[" + ("," + space).join(json.dumps(i) for i in items) + "]" + space
    got = read(text, piece)
    assert [item for _, item in got] == items
    single = lines and len(items) == 1
    assert [where for where, _ in got] == (
        ["spec"] if single else [f"spec #{i}" for i in range(len(items))])


@FUZZ
@given(st.text(max_size=80), st.integers(1, 9))
def test_any_text_is_read_or_refused_as_invalid(text: str, piece: int) -> None:
    try:
        got = read(text, piece)
    except InvalidSpec:
        return
    assert got


@FUZZ
@given(st.binary(max_size=60), st.integers(1, 9))
def test_any_bytes_are_read_or_refused_as_invalid(data: bytes, piece: int) -> None:
    try:
        read(data, piece)
    except InvalidSpec:
        pass


@FUZZ
@given(JSONISH)
def test_the_shortcut_never_passes_what_the_walk_refuses(value: Any) -> None:
    try:
        text = json.dumps(value)
    except (ValueError, TypeError):
        return
    if _plainly_storable(text, 0, len(text)):
        check_structure(json.loads(text))  # never Unstorable


@pytest.mark.parametrize("text", [
    '{"a": "\\u0000"}', '{"a": "\\ud800"}', '{"a": NaN}', '{"a": -Infinity}',
    "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2)])
def test_the_shortcut_walks_what_may_be_unstorable(text: str) -> None:
    assert not _plainly_storable(text, 0, len(text))
    with pytest.raises(Unstorable):
        check_structure(json.loads(text))


@pytest.mark.parametrize(("text", "said"), [
    ("[]", "the spec list is empty"),
    ('[{"a": 1},]', "not valid JSON"),
    ('[{"a": 1} {"b": 2}]', "Expecting ',' delimiter at line 1"),
    ('[{"a": 1}, {"b": 2}', "Expecting ']'"),
    ('[{"a": 1}]\n\n x', "Extra data at line 3"),
    ('{"a": 1}\n{"b": oops}', "not valid JSON (Expecting value at line 2)"),
    ('[{"a": 1},\n{"b": "\xff', "not valid JSON"),
])
def test_a_broken_list_is_refused_saying_where(text: str, said: str) -> None:
    with pytest.raises(InvalidSpec, match=re.escape(said)):
        read(text)


def test_a_text_that_is_not_utf8_names_its_byte() -> None:
    with pytest.raises(InvalidSpec, match="not UTF-8 text \\(byte 13\\)"):
        read(b'[{"a": 1}, {"' + b"\xff" + b'": 2}]')


def test_yaml_is_read_whole_and_its_aliases_counted_over_the_whole() -> None:
    assert [i for _, i in read("- actions: [{name: sleep}]\n- {actions: [{name: sleep}]}\n")] \
        == [{"actions": [{"name": "sleep"}]}] * 2
    bomb = "a: &a [" + ",".join(["x"] * 1000) + "]\nb: &b [" + ",".join(["*a"] * 1000) + "]\n"
    with pytest.raises(InvalidSpec, match="values once expanded"):
        read(bomb)


def test_a_spec_past_its_size_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_stream, "MAX_SPEC_BYTES", 1000)
    ok = json.dumps({"actions": [{"name": "sleep", "params": {"note": "x" * 500}}]})
    big = json.dumps({"actions": [{"name": "sleep", "params": {"note": "x" * 2000}}]})
    assert len(read(f"[{ok}, {ok}, {ok}]")) == 3  # the list is longer than one spec may be
    with pytest.raises(InvalidSpec, match="spec #1: larger than"):
        read(f"[{ok}, {big}]")


def test_batches_hold_every_spec_in_order_and_check_keys_across_them() -> None:
    specs = [{**SPEC, "labels": {"n": str(i)}} for i in range(25)]
    batches = list(spec_batches(spec_items(io.BytesIO(json.dumps(specs).encode())), size=10))
    assert [len(b) for b in batches] == [10, 10, 5]
    assert [s.labels["n"] for b in batches for s in b] == [str(i) for i in range(25)]
    keyed = [{**SPEC, "idempotency_key": "k"}] + [SPEC] * 15 + [{**SPEC, "idempotency_key": "k"}]
    with pytest.raises(InvalidSpec, match="spec #16: idempotency key appears twice"):
        list(spec_batches(spec_items(io.BytesIO(json.dumps(keyed).encode())), size=10))


def test_no_place_for_the_spool_is_said_as_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod whose root filesystem is read-only and that mounts nothing at /tmp: the enqueue
    of a stream says where it needs to write (exit 2), before anything is sent."""
    import tempfile

    from jobfence.errors import ConfigError
    from jobfence.submit import Spooled

    def nowhere(*args: object, **kw: object) -> None:
        raise FileNotFoundError(2, "No usable temporary directory found")

    monkeypatch.setattr(tempfile, "TemporaryFile", nowhere)
    with pytest.raises(ConfigError, match="TMPDIR, else /tmp"):
        Spooled()
