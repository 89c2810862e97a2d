"""What the database and the operating system can hold, checked before anything is written,
and what a job produces made storable before its terminal write.

Two directions:

* **Input** (specs, flags, settings) is *refused* when it cannot be stored or run: a string
  with a NUL (PostgreSQL's ``text`` and ``jsonb`` cannot hold one), a lone surrogate (not
  UTF-8), a non-finite number (not JSON), a structure nested deeper than ``MAX_DEPTH`` or
  larger than ``MAX_NODES`` once expanded (a YAML alias bomb is small on disk and enormous in
  memory), a duration longer than ``MAX_DURATION`` (``now() + interval`` overflows
  PostgreSQL's timestamps long before Python's ``timedelta`` does).
* **Output** (an action's result, an error text, a command's output tail) is *made
  storable*: NULs and lone surrogates replaced, lengths capped. A job's own output must
  never be the reason its terminal write fails — the command would run again.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")
"""A schema jobfence may use: a plain lower-case identifier, short enough that the role
names derived from it (``<schema>_maintainer``) stay within PostgreSQL's 63 bytes."""


def schema_refusal(schema: object) -> str | None:
    """Why ``schema`` may not hold an installation, or None. Never a schema PostgreSQL or
    every application shares (``public``, ``information_schema``, ``pg_*``): migrate would
    take over its objects and privileges (invariant 13)."""
    if not isinstance(schema, str) or not SCHEMA_NAME.match(schema):
        return (f"{str(schema)[:80]!r} is not a plain lower-case identifier of at most 48 "
                "characters")
    if schema in ("public", "information_schema") or schema.startswith("pg_"):
        return (f"{schema!r} belongs to PostgreSQL or to every application of the database: "
                "jobfence needs a schema of its own (the default is jobfence)")
    return None


QUEUE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
"""A queue's name: a DNS label (it names a pool, a ScaledJob, a label value)."""


def queue_name(value: str) -> str:
    """``value`` if it can name a queue; ValueError saying what one is otherwise."""
    if not QUEUE_NAME.fullmatch(value):
        raise ValueError(f"{value[:70]!r} is not a queue name (a DNS label: lower-case "
                         "letters, digits and '-', at most 63, starting and ending with a "
                         "letter or a digit)")
    return value


GROUP_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.:@/]{0,126}[A-Za-z0-9])?$")
"""A job's group (the database's jobs_group_key check says the same)."""


def group_key(value: str) -> str:
    """``value`` if it can name a group; ValueError saying what one is otherwise."""
    if not GROUP_KEY.fullmatch(value):
        raise ValueError(f"{value[:70]!r} is not a group (1 to 128 letters, digits and "
                         "'-_.:@/', starting and ending with a letter or a digit)")
    return value


MAX_DURATION = timedelta(days=36_500)
"""100 years: the longest ``ttl``, ``timeout``, ``expires_in`` or ``delay``. Anything longer
is a mistake, and PostgreSQL's timestamps end in the year 294276."""

MAX_WAIT_SECONDS = 366 * 86_400.0
"""The longest a command waits (``runs --wait --timeout``): a year, and never NaN, which
compares false with every bound."""

MAX_DEPTH = 32
"""Nesting of a spec (objects and lists within each other), params included."""

MAX_NODES = 1_000_000
"""Values in one call's specs once aliases are expanded (a list of 100k small specs fits)."""

MAX_SPEC_BYTES = 64 * 1024 * 1024
"""Size of the spec text one call reads (file or stdin)."""

MAX_ERROR_CHARS = 2000
"""``error`` and ``reason`` of a job: one readable paragraph."""

MAX_DETAIL_CHARS = 64 * 1024
"""``error_detail``: a traceback or a stderr tail."""

MAX_RESULT_BYTES = 256 * 1024
"""An action's JSON result; a larger one is replaced by a note saying so."""

REPLACEMENT = "\ufffd"


class Unstorable(ValueError):
    """A value that cannot be stored or run; the message says where and why."""


# -- input: refuse ---------------------------------------------------------------------------


def check_text(value: str, where: str) -> str:
    """``value`` if PostgreSQL and the OS can hold it; Unstorable otherwise."""
    if "\x00" in value:
        raise Unstorable(f"{where}: contains a NUL character, which cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Unstorable(f"{where}: is not valid UTF-8 text") from None
    return value


def check_structure(data: object, where: str = "spec", *, max_depth: int = MAX_DEPTH,
                    max_nodes: int = MAX_NODES) -> None:
    """Refuse what JSON and PostgreSQL cannot hold, before anything expands it.

    Iterative, and every visit counts against ``max_nodes`` — a value reached twice (a YAML
    alias) counts twice, exactly as it would cost when serialized — so a bomb is refused
    after ``max_nodes`` steps, whatever its expanded size. A value's path (``spec.a[0]``) is
    spelled out only for the message of the one refused: the walk itself carries a link to
    its parent's."""
    budget = max_nodes
    stack: list[tuple[object, int, _Trail]] = [(data, 0, None)]
    while stack:
        value, depth, trail = stack.pop()
        budget -= 1
        if budget < 0:
            raise Unstorable(f"{where}: more than {max_nodes:,} values once expanded "
                             "(YAML aliases count each time they are used)")
        if depth > max_depth:
            raise Unstorable(f"{_spelled(where, trail)}: nested more than {max_depth} levels "
                             "deep")
        if isinstance(value, str):
            if "\x00" in value or not value.isascii():
                check_text(value, _spelled(where, trail))
        elif isinstance(value, int) or value is None:  # bool is an int
            continue
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise Unstorable(f"{_spelled(where, trail)}: {value} is not a JSON number")
        elif isinstance(value, dict | Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise Unstorable(f"{_spelled(where, trail)}: key {key!r} is not a "
                                     "string")
                if "\x00" in key or not key.isascii():
                    check_text(key, f"{_spelled(where, trail)}: key")
                stack.append((item, depth + 1, (trail, key)))
        elif isinstance(value, list | tuple):
            stack.extend((item, depth + 1, (trail, i)) for i, item in enumerate(value))
        else:
            raise Unstorable(f"{_spelled(where, trail)}: a {type(value).__name__} is not a "
                             "JSON value")


_Trail = tuple[Any, str | int] | None
"""Where a value sits: its parent's trail and its key (an object's) or index (a list's)."""


def _spelled(where: str, trail: _Trail) -> str:
    steps: list[str] = []
    while trail is not None:
        trail, step = trail
        steps.append(f"[{step}]" if isinstance(step, int) else f".{step}")
    return where + "".join(reversed(steps))


def check_duration(value: timedelta, text: object) -> timedelta:
    if value > MAX_DURATION:
        raise Unstorable(f"duration {text!r} is longer than the limit of 100 years (P36500D)")
    return value


# -- output: make storable -----------------------------------------------------------------


def storable_text(value: str | None, limit: int = MAX_ERROR_CHARS) -> str | None:
    """``value`` with NULs and lone surrogates replaced and its length capped (the head is
    kept, marked as cut)."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", REPLACEMENT)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    if len(value) > limit:
        value = value[: max(0, limit - 12)] + " …(truncated)"
    return value


def storable_json(value: Any, *, max_bytes: int = MAX_RESULT_BYTES) -> str | None:
    """An action's result as JSON that ``jsonb`` accepts: strings made storable, non-finite
    numbers and unknown types turned into text, nesting capped; a result larger than
    ``max_bytes`` replaced by a note."""
    if value is None:
        return None
    text = json.dumps(_clean(value, 0), separators=(",", ":"), allow_nan=False)
    if len(text) > max_bytes:
        text = json.dumps({"truncated": True,
                           "note": f"the result was {len(text):,} bytes; at most "
                                   f"{max_bytes:,} are stored"})
    return text


def _clean(value: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        return "…(nested too deep)"
    if isinstance(value, str):
        return storable_text(value, MAX_RESULT_BYTES)
    if isinstance(value, bool | int) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {storable_text(str(k), 1000): _clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v, depth + 1) for v in value]
    return storable_text(str(value), MAX_ERROR_CHARS)
