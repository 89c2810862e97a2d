"""What a request to the API says, read strictly: its query, its path's parameters and its
body. Whatever a client sends, it ends here as a value a route can use or as a typed
refusal (``InvalidSpec``: 400, ``TooLarge``: 413) — never as an exception a route did not
expect (a 500).

- **The query** of every route goes through one parser, ``parse_query``, against the
  parameters that route declares: each name at most once, every name known, values decoded
  as UTF-8 (percent-encoded bytes that are not UTF-8 are refused, not replaced), no NUL,
  each value parsed by its own parser. An empty value (``?status=``) means "not given".
  Numbers are ASCII digits: ``str.isdigit`` and ``int`` also take "²", "١٢" or "1_0".
- **A body** is read while it streams, chunked or not, and refused (413) as soon as it
  passes the limit: a server never holds more than ``limit`` bytes of one request, however
  much a client sends (``read_body``).
- **JSON** is measured before it is parsed (``parse_json``): nesting deeper than
  ``MAX_DEPTH`` is refused before the parser could recurse into it, ``NaN`` and
  ``Infinity`` are not JSON, and what is parsed passes ``jobfence.limits.check_structure``
  (no NUL, no lone surrogate, a bounded number of values).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes
from uuid import UUID

from jobfence.errors import InvalidSpec, TooLarge
from jobfence.ids import parse_job_id
from jobfence.limits import MAX_DEPTH, Unstorable, check_structure, check_text, queue_name

MAX_QUERY_BYTES = 16 * 1024
"""A query string longer than this is refused: no filter of the API needs more."""

MAX_VALUE_CHARS = 1000
"""A query parameter's value (a resource key is at most 500 characters, a label 1,000)."""

MAX_LABELS = 64
"""Labels one filter may ask for (a job carries at most 64)."""


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter a route takes: how its text becomes a value, and the value when
    it is not given."""

    parse: Callable[[str], Any]
    default: Any = None


@dataclass(frozen=True, slots=True)
class Query:
    values: dict[str, Any]
    """Every declared parameter: its parsed value, or its default."""
    given: dict[str, str]
    """The parameters the client gave, as text (to build the next page's link)."""


# -- the query -------------------------------------------------------------------------------


def parse_query(raw: bytes, declared: Mapping[str, Param]) -> Query:
    """The query string ``raw`` (as sent: percent-encoded, ``+`` for a space) read against
    the parameters a route declares; InvalidSpec naming what is wrong."""
    if len(raw) > MAX_QUERY_BYTES:
        raise InvalidSpec(f"the query is longer than {MAX_QUERY_BYTES} bytes")
    given: dict[str, str] = {}
    for part in raw.split(b"&"):
        if not part:
            continue  # "?&limit=50": an empty part says nothing
        name_raw, _, value_raw = part.partition(b"=")
        name = _decoded(name_raw, "a parameter's name")
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise InvalidSpec(f"unknown parameter {name[:60]!r} (this route takes: {known})")
        if name in given:
            raise InvalidSpec(f"parameter {name!r} is given more than once")
        given[name] = _decoded(value_raw, f"parameter {name!r}")
    values = {name: param.parse(given[name]) if given.get(name) else param.default
              for name, param in declared.items()}
    return Query(values, {k: v for k, v in given.items() if v})


def _decoded(raw: bytes, what: str) -> str:
    try:
        text = unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidSpec(f"{what} is not UTF-8 text once percent-decoded") from None
    try:
        check_text(text, what)
    except Unstorable as exc:
        raise InvalidSpec(str(exc)) from None
    if len(text) > MAX_VALUE_CHARS:
        raise InvalidSpec(f"{what} is longer than {MAX_VALUE_CHARS} characters")
    return text


# -- parsers of one value (query and path alike) -------------------------------------------

_DIGITS = re.compile(r"[0-9]{1,9}")


def whole(name: str, low: int, high: int) -> Callable[[str], int]:
    """A whole number from ``low`` to ``high``, written in ASCII digits."""

    def parse(text: str) -> int:
        if not _DIGITS.fullmatch(text) or not low <= int(text) <= high:
            raise InvalidSpec(f"{name} must be a whole number from {low} to {high}")
        return int(text)

    return parse


def one_of(name: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise InvalidSpec(f"{name} must be one of {', '.join(choices)}")
        return text

    return parse


def text_of(name: str, most: int) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if len(text) > most:
            raise InvalidSpec(f"{name} is longer than {most} characters")
        return text

    return parse


def job_id(text: str) -> UUID:
    try:
        return parse_job_id(text)
    except ValueError:
        raise InvalidSpec(f"{text[:80]!r} is not a job id (expected a UUID)") from None


def workflow_id(text: str) -> UUID:
    try:
        return parse_job_id(text)
    except ValueError:
        raise InvalidSpec(f"{text[:80]!r} is not a workflow id (expected a UUID)") from None


def queue(text: str) -> str:
    try:
        return queue_name(text)
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None


def labels(text: str) -> dict[str, str]:
    """``key=value[,key=value...]``: jobs carrying all of these labels."""
    out: dict[str, str] = {}
    for term in text.split(","):
        key, eq, value = term.partition("=")
        if not eq or not key.strip():
            raise InvalidSpec(f"label {term[:80]!r}: give key=value")
        out[key.strip()] = value.strip()
    if len(out) > MAX_LABELS:
        raise InvalidSpec(f"at most {MAX_LABELS} labels in one filter")
    return out


# -- the body ------------------------------------------------------------------------------

_DECIMAL = re.compile(r"[0-9]{1,20}")


async def read_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """The whole body, read as it streams; ``TooLarge`` once it passes ``limit`` bytes
    (at once when its ``Content-Length`` says it will), having held at most ``limit``."""
    if declared is not None and _DECIMAL.fullmatch(declared.strip()) \
            and int(declared) > limit:
        raise TooLarge(f"the body is larger than {limit} bytes")
    body = bytearray()
    async for chunk in chunks:
        if len(body) + len(chunk) > limit:
            raise TooLarge(f"the body is larger than {limit} bytes")
        body += chunk
    return bytes(body)


_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth_at_most(raw: bytes, depth: int) -> bool:
    """Whether the JSON text ``raw`` nests at most ``depth`` arrays and objects within each
    other, found without recursion: strings taken out, then everything but the brackets,
    then the innermost pairs removed a level at a time. A text whose brackets do not pair
    up is not JSON: False."""
    if raw.count(b"[") + raw.count(b"{") <= depth:
        return True
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(depth):
        if not brackets:
            return True
        brackets = brackets.replace(b"[]", b"").replace(b"{}", b"")
    return not brackets


def parse_json(raw: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """A request body's JSON: UTF-8, nested at most ``max_depth`` levels below the
    top (``jobfence.limits``), numbers finite, text storable; InvalidSpec saying why not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSpec(f"the body is not JSON: not UTF-8 (byte {exc.start})") from None
    if not json_depth_at_most(raw, max_depth + 1):
        raise InvalidSpec(f"the body is nested more than {max_depth} levels deep, or is not "
                          "JSON (its brackets do not pair up)")
    try:
        data = json.loads(text, parse_constant=_not_a_number)
    except RecursionError:  # cannot happen past the measure above; never a 500 if it does
        raise InvalidSpec(f"the body is nested more than {max_depth} levels deep") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of too many digits
        why = (f"{exc.msg} at line {exc.lineno} column {exc.colno}"
               if isinstance(exc, json.JSONDecodeError) else str(exc))
        raise InvalidSpec(f"the body is not JSON: {why}") from None
    try:
        check_structure(data, "body", max_depth=max_depth)
    except Unstorable as exc:
        raise InvalidSpec(str(exc)) from None
    return data


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
