"""Job spec validation: everything is checked before anything is written, with a message
that says what is wrong. A spec that would expire before it may start (its ``expires_in``
ending before its ``run_at`` or ``delay``) never passes, fuzzed over both."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.durations import format_duration, parse_duration
from jobfence.errors import InvalidSpec
from jobfence.ids import uuid7
from jobfence.spec import parse_action_arg, parse_spec_text, parse_specs

SLEEP = {"name": "sleep", "params": {"seconds": 1}}


def one(**kw: object) -> dict[str, object]:
    return {"actions": [SLEEP], **kw}


def test_full_spec_is_accepted() -> None:
    [spec] = parse_specs(one(resource="db.events", max_attempts=5, priority=3,
                             after=[str(uuid7())], idempotency_key="k", ttl="P7D",
                             timeout="PT1H30M", expires_in="PT10M", labels={"team": "a"}))
    assert spec.ttl == timedelta(days=7) and spec.timeout == timedelta(hours=1, minutes=30)


@pytest.mark.parametrize(("text", "expected"), [
    ("PT90S", timedelta(seconds=90)), ("PT1H30M", timedelta(hours=1, minutes=30)),
    ("P1DT12H", timedelta(days=1, hours=12)), ("PT0.5S", timedelta(seconds=0.5)),
    ("P2W", timedelta(days=14)), ("P7D", timedelta(days=7)), ("pt1m", timedelta(minutes=1)),
    ("PT1.5H", timedelta(minutes=90)),
])
def test_iso_durations_a_string_slicing_parser_misses(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["garbage", "PT", "P", "1:00:00", "12", "-PT1H", "PT0S",
                                  "P1X", ""])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_format_duration_round_trips() -> None:
    for text in ("PT1H30M", "P1DT12H", "PT0.5S", "P7D"):
        assert parse_duration(format_duration(parse_duration(text))) == parse_duration(text)


@pytest.mark.parametrize(("spec", "message"), [
    (one(ttl="PT1X"), "ttl: .*ISO 8601"),
    (one(max_attempts=-1), "max_attempts"),
    (one(max_attempts=0), "max_attempts"),
    ({"actions": []}, "actions"),
    ({"actions": [{"name": "nope"}]}, "unknown action 'nope'"),
    ({"actions": [{"name": "sleep", "params": {"seconds": -1}}]}, "seconds"),
    ({"actions": [{"name": "command", "params": {}}]}, "argv"),
    ({"actions": [{"name": "command", "params": {"argv": ["x"], "timeout": "soon"}}]},
     "timeout"),
    (one(after=["not-a-uuid"]), "after"),
    (one(colour="blue"), "colour"),
    (one(inputs="http://x/y"), "s3://"),
    (one(resource=""), "resource"),
])
def test_invalid_specs_say_what_is_wrong(spec: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSpec, match=message):
        parse_specs(spec)


@pytest.mark.parametrize("spec", [
    one(delay="PT1H", expires_in="PT10M"),
    one(delay="PT1H", expires_in="PT1H"),  # expiring as it becomes runnable: a race lost
    one(delay="P1D", expires_in="PT23H59M59S"),
    one(run_at="2099-01-01T00:00:00Z", expires_in="P7D"),
    one(run_at=(datetime.now(UTC) + timedelta(hours=2)).isoformat(), expires_in="PT1H"),
])
def test_a_spec_that_would_expire_before_it_may_start_is_invalid(
        spec: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec, match="expire before it may start"):
        parse_specs(spec)


@pytest.mark.parametrize("spec", [
    one(delay="PT1H", expires_in="PT1H1S"),
    one(run_at="2020-01-01T00:00:00Z", expires_in="PT1S"),  # due already
    one(run_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat(), expires_in="PT2H"),
    one(expires_in="PT1S"), one(delay="PT1H"),
])
def test_an_expiry_after_the_scheduled_start_is_accepted(spec: dict[str, object]) -> None:
    assert len(parse_specs(spec)) == 1


SECONDS = st.integers(1, 400 * 86_400).map(lambda s: timedelta(seconds=s))


@settings(max_examples=500, derandomize=True, database=None)
@given(expires_in=SECONDS, start=SECONDS | st.integers(-400 * 86_400, 0).map(
    lambda s: timedelta(seconds=s)), by_delay=st.booleans())
def test_no_spec_passes_that_would_expire_before_it_may_start(
        expires_in: timedelta, start: timedelta, by_delay: bool) -> None:
    """Whatever the durations and timestamps, a spec that passes may start before it
    expires; and one that may start before it expires passes."""
    now = datetime.now(UTC)
    when = ({"delay": format_duration(start)} if by_delay and start > timedelta(0)
            else {"run_at": (now + start).isoformat()})
    spec = one(expires_in=format_duration(expires_in), **when)
    try:
        [parsed] = parse_specs(spec)
    except InvalidSpec as exc:
        assert "expire before it may start" in str(exc)
        assert start >= expires_in  # so every spec that may start before it expires passes
        return
    later = datetime.now(UTC)  # expires_in counts from the enqueue, later still
    assert parsed.expires_in is not None
    if parsed.delay is not None:
        assert parsed.delay < parsed.expires_in
    else:
        assert parsed.run_at is not None and parsed.run_at < later + parsed.expires_in


def test_list_errors_name_the_spec() -> None:
    with pytest.raises(InvalidSpec, match=r"spec #1"):
        parse_specs([one(), one(priority="high")])


def test_repeated_idempotency_key_in_one_call_is_invalid() -> None:
    with pytest.raises(InvalidSpec, match="twice"):
        parse_specs([one(idempotency_key="k"), one(idempotency_key="k")])


def test_yaml_and_json_specs() -> None:
    assert len(parse_spec_text('[{"actions": [{"name": "sleep", "params": {"seconds": 0}}]}]')) == 1
    [spec] = parse_spec_text("actions:\n  - name: sleep\n    params: {seconds: 2}\n"
                             "resource: db.t\n")
    assert spec.resource == "db.t"
    with pytest.raises(InvalidSpec, match="not valid JSON"):
        parse_spec_text("{oops")


def test_action_arguments() -> None:
    assert parse_action_arg("sleep") == {"name": "sleep", "params": {}}
    assert parse_action_arg('sleep:{"seconds": 2}') == {"name": "sleep", "params": {"seconds": 2}}
    with pytest.raises(InvalidSpec, match="not valid JSON"):
        parse_action_arg("sleep:{seconds}")
    with pytest.raises(InvalidSpec, match="JSON object"):
        parse_action_arg("sleep:[1]")


def test_fingerprint_ignores_the_key_but_not_the_work() -> None:
    a, b, c = parse_specs([one(idempotency_key="a"), one(idempotency_key="b"),
                           {"actions": [{"name": "sleep", "params": {"seconds": 2}}]}])
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
