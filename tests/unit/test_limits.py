"""Properties of the bounds and sanitizers (hypothesis, a fixed seed): whatever text or
structure comes in, parsing either gives a value PostgreSQL can hold or refuses it with the
typed error — never another exception — and whatever a job produces is made storable."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.durations import parse_duration
from jobfence.errors import InvalidSpec
from jobfence.limits import (
    MAX_DURATION,
    MAX_RESULT_BYTES,
    Unstorable,
    check_structure,
    storable_json,
    storable_text,
)
from jobfence.spec import parse_action_arg, parse_spec_text, parse_specs
from tests.support.fuzz import ANY_TEXT, JSONISH

FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None)



@FUZZ
@given(ANY_TEXT)
def test_storable_text_is_always_valid_utf8_without_nul(text: str) -> None:
    out = storable_text(text)
    assert out is not None and "\x00" not in out
    out.encode("utf-8")
    assert len(out) <= 2000


@FUZZ
@given(JSONISH)
def test_storable_json_always_loads_and_holds_nothing_jsonb_refuses(value: Any) -> None:
    text = storable_json(value)
    if value is None:
        assert text is None
        return
    assert text is not None and len(text) <= MAX_RESULT_BYTES + 200
    assert "\\u0000" not in text
    text.encode("utf-8")
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


@FUZZ
@given(JSONISH)
def test_check_structure_accepts_exactly_what_json_can_carry(value: Any) -> None:
    try:
        check_structure(value)
    except Unstorable:
        try:  # refused: then JSON or PostgreSQL could not have held it
            text = json.dumps(value, allow_nan=False, ensure_ascii=False)
            text.encode("utf-8")
        except (ValueError, UnicodeEncodeError):
            return
        assert "\\u0000" in text, value
        return
    text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")
    assert "\\u0000" not in text


@FUZZ
@given(ANY_TEXT)
def test_parse_duration_gives_a_bounded_positive_duration_or_value_error(text: str) -> None:
    try:
        value = parse_duration(text)
    except ValueError:
        return
    assert timedelta(0) < value <= MAX_DURATION


@FUZZ
@given(st.integers(min_value=0, max_value=10**12), st.sampled_from("SMHDW"))
def test_every_iso_duration_up_to_a_century_parses_and_longer_ones_do_not(
        n: int, unit: str) -> None:
    text = f"PT{n}{unit}" if unit in "SMH" else f"P{n}{unit}"
    seconds = n * {"S": 1, "M": 60, "H": 3600, "D": 86400, "W": 604800}[unit]
    if n == 0 or seconds > MAX_DURATION.total_seconds():
        with pytest.raises(ValueError):
            parse_duration(text)
    else:
        assert parse_duration(text).total_seconds() == seconds


@FUZZ
@given(ANY_TEXT | st.binary(max_size=200).map(lambda b: b.decode("utf-8", "surrogateescape")))
def test_spec_text_parses_or_is_refused_as_invalid(text: str) -> None:
    try:
        specs = parse_spec_text(text)
    except InvalidSpec as exc:
        assert str(exc), "a refusal says why"
        return
    for spec in specs:
        json.dumps(spec.model_dump(mode="json"), allow_nan=False).encode("utf-8")


@FUZZ
@given(JSONISH)
def test_spec_structures_parse_or_are_refused_as_invalid(value: Any) -> None:
    try:
        parse_specs(value)
    except InvalidSpec:
        pass


ACTION = st.fixed_dictionaries({
    "name": st.sampled_from(["sleep", "command", "nope", ""]) | ANY_TEXT,
    "params": st.dictionaries(st.sampled_from(["seconds", "argv", "env", "timeout", "x"]),
                              JSONISH, max_size=3)})
SPEC = st.fixed_dictionaries({"actions": st.lists(ACTION, min_size=0, max_size=2)}, optional={
    "resource": JSONISH, "max_attempts": JSONISH, "priority": JSONISH, "after": JSONISH,
    "idempotency_key": JSONISH, "ttl": JSONISH | st.sampled_from(["P999999Y", "PT1S"]),
    "timeout": JSONISH, "expires_in": JSONISH, "labels": JSONISH, "inputs": JSONISH})


@FUZZ
@given(SPEC)
def test_specs_shaped_like_real_ones_parse_to_storable_jobs_or_are_refused(
        spec: dict[str, Any]) -> None:
    try:
        [parsed] = parse_specs(spec)
    except InvalidSpec:
        return
    body = json.dumps(parsed.model_dump(mode="json"), allow_nan=False)
    assert "\\u0000" not in body
    for duration in (parsed.ttl, parsed.timeout, parsed.expires_in):
        assert duration is None or timedelta(0) < duration <= MAX_DURATION


@FUZZ
@given(ANY_TEXT)
def test_action_arguments_parse_or_are_refused(text: str) -> None:
    try:
        action = parse_action_arg(text)
    except InvalidSpec:
        return
    assert isinstance(action["params"], dict)


def test_a_float_result_that_is_not_a_number_is_stored_as_text() -> None:
    assert json.loads(storable_json({"x": math.nan}) or "") == {"x": "nan"}
