"""Job specs read as a stream: ``enqueue --spec`` takes a list of any length and holds one
spec at a time, never the list.

A JSON list (``[{...}, {...}]``) or JSON objects one after another (JSON Lines, or any
whitespace between them) are read a spec at a time, each decoded by the ``json`` module
as soon as its text is in; a single object is one spec. Anything else — a YAML text — is
read whole, at most ``MAX_SPEC_BYTES``, as before: YAML's aliases can only be counted
over the whole document. So is a text whose first spec is not JSON (a YAML flow mapping
looks like JSON up to its first key): the first spec decides, once, which it is.

Each spec's text is at most ``MAX_SPEC_BYTES``; what a spec holds is then checked as any
spec is (``jobfence.spec.Checking``). An error names the line of the text where JSON stopped
making sense, as ``json.loads`` would.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import BinaryIO

from jobfence.errors import InvalidSpec
from jobfence.limits import MAX_DEPTH, MAX_NODES, MAX_SPEC_BYTES, Unstorable, check_structure
from jobfence.spec import Checking, JobSpec, load_spec_text

CHUNK = 1 << 20
"""Bytes read at a time."""

BATCH = 2_000
"""Specs validated, and then written, together."""

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Text:
    """The text of a stream, read a chunk at a time; what is behind ``pos`` is let go once
    the format is decided (``keep_all`` off)."""

    def __init__(self, stream: BinaryIO, source: str) -> None:
        self.stream = stream
        self.source = source
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.read_bytes = 0
        self.lines = 0
        """Line breaks in the text let go of (for the line an error names)."""
        self.keep_all = True
        self.walked = False
        """Whether the last value's text alone shows it storable (``_plainly_storable``)."""

    def more(self, at_least: int = CHUNK) -> bool:
        """Read at least ``at_least`` more bytes (or to the end); whether any came."""
        if self.eof:
            return False
        if not self.keep_all and self.pos:
            self.lines += self.buf.count("\n", 0, self.pos)
            self.buf, self.pos = self.buf[self.pos:], 0
        got = 0
        while got < at_least:
            data = self.stream.read(max(CHUNK, at_least - got))
            if not data:
                self.eof = True
                self._decode(b"", final=True)
                break
            got += len(data)
            self._decode(data)
        return got > 0

    def _decode(self, data: bytes, *, final: bool = False) -> None:
        pending = len(self.utf8.getstate()[0])
        try:
            self.buf += self.utf8.decode(data, final)
        except UnicodeDecodeError as exc:
            at = self.read_bytes - pending + exc.start
            raise InvalidSpec(f"{self.source}: not UTF-8 text (byte {at})") from None
        self.read_bytes += len(data)

    def next_char(self) -> str | None:
        """The next character that is not JSON whitespace (not consumed), or None at the
        end of the text."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return None

    def value(self, where: str) -> object:
        """The JSON value at ``pos`` (consumed), reading on while the text so far ends
        inside it — twice as much each time, so a large spec is decoded a few times, not
        once a chunk."""
        want = CHUNK
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise InvalidSpec(f"{where}: nested too deep") from None
            except ValueError as exc:  # JSONDecodeError, or an integer of too many digits
                if self._grown(where, want):
                    want *= 2
                    continue
                raise InvalidSpec(f"{self.source}: not valid JSON ({self._said(exc)})") \
                    from None
            if end == len(self.buf) and self._grown(where, want):
                continue  # a number may go on in the text not yet read
            if end - self.pos > MAX_SPEC_BYTES:
                raise _too_large(where)
            self.walked = _plainly_storable(self.buf, self.pos, end)
            self.pos = end
            return value

    def _grown(self, where: str, want: int) -> bool:
        if len(self.buf) - self.pos > MAX_SPEC_BYTES:
            raise _too_large(where)
        return self.more(want)

    def _said(self, exc: ValueError) -> str:
        if isinstance(exc, json.JSONDecodeError):
            return f"{exc.msg} at line {self._line(exc.pos)}"
        return str(exc)

    def refuse(self, expected: str) -> InvalidSpec:
        return InvalidSpec(f"{self.source}: not valid JSON ({expected} at line "
                           f"{self._line(self.pos)})")

    def _line(self, pos: int) -> int:
        """The line of the text ``pos`` (in ``buf``) is on."""
        return self.lines + self.buf.count("\n", 0, pos) + 1

    def rest(self) -> str:
        """The whole text (the format undecided: nothing was let go), at most
        ``MAX_SPEC_BYTES``."""
        while self.more():
            if len(self.buf) > MAX_SPEC_BYTES:
                break
        if len(self.buf) > MAX_SPEC_BYTES or self.read_bytes > MAX_SPEC_BYTES:
            raise _too_large(self.source)
        return self.buf


_SUSPECT = re.compile(r"\\u(?:0000|[dD][89a-fA-F])|NaN|Infinity")
"""What in a JSON text may decode to what PostgreSQL cannot hold: a NUL, half of a
surrogate pair, a number that is not one (``json`` reads ``NaN`` and ``Infinity``)."""


def _too_large(where: str) -> InvalidSpec:
    return InvalidSpec(f"{where}: larger than {MAX_SPEC_BYTES // (1024 * 1024)} MiB")


def _plainly_storable(text: str, start: int, end: int) -> bool:
    """Whether the JSON text of a value shows, without walking the value, that it passes
    ``check_structure``: nothing suspect in it, fewer brackets than the deepest nesting
    allowed (each level opens one), fewer characters than values allowed (each value takes
    one). Only a yes is sure: a no walks the value."""
    return (end - start < MAX_NODES
            and text.count("[", start, end) + text.count("{", start, end) <= MAX_DEPTH
            and _SUSPECT.search(text, start, end) is None)


def spec_items(stream: BinaryIO, source: str = "spec") -> Iterator[tuple[str, object, bool]]:
    """Each spec of the text ``stream`` holds, with where it is (``spec #N`` in a list,
    ``spec`` alone) and whether its structure is known storable already (``walked``), not
    yet validated; InvalidSpec for a text that holds none or is not
    JSON nor YAML."""
    text = _Text(stream, source)
    first = text.next_char()
    if first in ("[", "{"):
        start = text.pos
        if first == "[":
            text.pos += 1
            if text.next_char() == "]":
                text.pos += 1
                if text.next_char() is not None:
                    raise text.refuse("Extra data")
                raise InvalidSpec("the spec list is empty")
        try:
            item = text.value("spec #0")
        except InvalidSpec:
            text.pos = start
            yield from _whole(text)  # not JSON from its first spec: YAML, or an error
            return
        if first == "{" and isinstance(item, dict) and "workflow" in item:
            _no_repeated_keys(text.buf[start:text.pos])  # a step named twice is an error
        text.keep_all = False
        if first == "[":
            yield from _listed(text, item)
        else:
            yield from _one_after_another(text, item)
        return
    yield from _whole(text)


def _listed(text: _Text, item: object) -> Iterator[tuple[str, object, bool]]:
    n = 0
    while True:
        yield f"spec #{n}", item, text.walked
        n += 1
        c = text.next_char()
        if c == "]":
            text.pos += 1
            if text.next_char() is not None:
                raise text.refuse("Extra data")
            return
        if c != ",":
            raise text.refuse("Expecting ',' delimiter" if c else "Expecting ']'")
        text.pos += 1
        if text.next_char() is None:
            raise text.refuse("Expecting value")
        item = text.value(f"spec #{n}")


def _one_after_another(text: _Text, item: object) -> Iterator[tuple[str, object, bool]]:
    if text.next_char() is None:
        yield "spec", item, text.walked
        return
    n = 0
    while True:
        yield f"spec #{n}", item, text.walked
        n += 1
        if text.next_char() is None:
            return
        item = text.value(f"spec #{n}")


def _whole(text: _Text) -> Iterator[tuple[str, object, bool]]:
    data = load_spec_text(text.rest(), text.source)
    try:
        check_structure(data)  # YAML's aliases count each time they are used, in all
    except Unstorable as exc:
        raise InvalidSpec(str(exc)) from None
    if isinstance(data, list):
        if not data:
            raise InvalidSpec("the spec list is empty")
        yield from ((f"spec #{i}", item, True) for i, item in enumerate(data))
    else:
        yield "spec", data, True


def spec_batches(items: Iterator[tuple[str, object, bool]],
                 size: int = BATCH) -> Iterator[list[JobSpec]]:
    """The specs of ``items`` validated, ``size`` at a time (``jobfence.spec.Checking``)."""
    checking = Checking()
    batch: list[JobSpec] = []
    listed = True
    for where, item, walked in items:
        listed = where != "spec"
        batch.append(checking.spec(item, where, walked=walked))
        if len(batch) >= size:
            checking.resources(batch, listed=listed)
            yield batch
            batch = []
    if batch:
        checking.resources(batch, listed=listed)
        yield batch


def _no_repeated_keys(text: str) -> None:
    """InvalidSpec when an object of the JSON ``text`` names a key twice (``json`` keeps the
    last silently): read again so only for a workflow, where a step named twice would
    vanish."""
    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        seen: dict[str, object] = {}
        for key, value in items:
            if key in seen:
                raise InvalidSpec(f"{key[:70]!r} is named twice in one object (a step "
                                  "named twice?)")
            seen[key] = value
        return seen

    json.loads(text, object_pairs_hook=pairs)
