"""A queue's rate as an operator writes it: N/PERIOD, the period a word or an ISO 8601
duration; anything else a clear error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobfence.durations import parse_rate


@pytest.mark.parametrize(("text", "expected"), [
    ("60/minute", (60, 60.0)), ("5/PT10S", (5, 10.0)), ("0/second", (0, 1.0)),
    (" 7/Hour ", (7, 3600.0)), ("1000000/day", (1_000_000, 86400.0))])
def test_rates_as_written(text: str, expected: tuple[int, float]) -> None:
    assert parse_rate(text) == expected


@given(st.text(max_size=30))
def test_any_other_text_is_a_clear_error(text: str) -> None:
    try:
        n, seconds = parse_rate(text)
    except ValueError as exc:
        assert str(exc)
    else:
        assert 0 <= n <= 1_000_000 and 1 <= seconds <= 86400
