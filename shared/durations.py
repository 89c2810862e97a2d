"""ISO 8601 durations (``PT90S``, ``PT1H30M``, ``P1DT12H``, ``PT0.5S``, ``P2W``) parsed by a
real parser (pydantic's), never by string slicing. Years and months have no fixed length:
they count as 365 and 30 days.
"""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from typing import Annotated

from pydantic import BeforeValidator, TypeAdapter, ValidationError

from jobfence.limits import check_duration


@lru_cache(maxsize=1)
def _timedelta() -> TypeAdapter[timedelta]:
    """Built on first use: a function that parses no duration does not pay for it."""
    return TypeAdapter(timedelta)


def parse_duration(text: object) -> timedelta:
    """A positive duration of at most 100 years from an ISO 8601 string; ValueError saying
    what is wrong."""
    if isinstance(text, timedelta):
        value = text
    else:
        if not isinstance(text, str) or not text.strip().upper().startswith("P"):
            raise ValueError(f"{text!r} is not an ISO 8601 duration (e.g. PT90S, PT1H30M, P7D)")
        try:
            value = _timedelta().validate_python(text.strip().upper())
        except (ValidationError, OverflowError):
            raise ValueError(
                f"{text!r} is not an ISO 8601 duration (e.g. PT90S, PT1H30M, P7D)"
            ) from None
    if value <= timedelta(0):
        raise ValueError(f"duration {text!r} must be positive")
    return check_duration(value, text)


def format_duration(value: timedelta) -> str:
    """The ISO 8601 form of a duration (``P1DT30M``), as pydantic writes it: the parser's
    own inverse."""
    text: str = _timedelta().dump_python(value, mode="json")
    return text


PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}
"""The periods a rate may name by word; any other is an ISO 8601 duration."""


def parse_rate(text: str) -> tuple[int, float]:
    """``N/PERIOD`` — N starts (0 to 1,000,000) per period, the period a word (``second``,
    ``minute``, ``hour``, ``day``) or an ISO 8601 duration of 1 s to 1 day (``PT10S``) —
    as (N, seconds); ValueError saying what is wrong."""
    n, sep, period = text.strip().partition("/")
    if not sep or not n.isascii() or not n.isdigit() or len(n) > 7 \
            or int(n) > 1_000_000:
        raise ValueError(f"rate {text[:40]!r}: give N/PERIOD, N from 0 to 1000000 "
                         "(e.g. 60/minute, 5/PT10S)")
    word = period.strip().lower()
    seconds = PERIODS.get(word) or parse_duration(period).total_seconds()
    if not 1 <= seconds <= 86400:
        raise ValueError(f"rate {text[:40]!r}: the period must be from 1 second to 1 day")
    return int(n), seconds


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
"""A pydantic field type: an ISO 8601 duration string in, a positive timedelta out."""
