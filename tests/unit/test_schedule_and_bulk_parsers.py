"""The parsers of schedules and bulk actions, and small pieces, without a database: cron
expressions and time zones (fuzzed: whatever the text, a schedule or ``InvalidSpec``, never
another error), the ticks a pass enqueues (the latest due, never before the expected one),
bulk time filters, the quantiles of a stored histogram, and what a job's params show (env
values masked, the one-line summary)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.bulk import parse_time
from jobfence.console.queue_history import flags, minutes, quantile
from jobfence.errors import InvalidSpec
from jobfence.schedules import Cron, due_tick, schedule_spec, zone
from jobfence.views import MASK, shown_params, summary

FIELD = st.sampled_from(["*", "*/5", "1-5", "0", "59", "60", "L", "MON", "JAN", "?", "#", "W",
                         "1,2", "-", "5-1", "*/0", "1/2", "7", "32", "13"])


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(st.lists(FIELD, min_size=0, max_size=7).map(" ".join) | st.text(max_size=40),
       st.sampled_from(["UTC", "Europe/Riga", "America/St_Johns", "Asia/Kathmandu"]))
def test_a_cron_expression_parses_or_is_invalid_input(expr: str, tz: str) -> None:
    try:
        cron = Cron.parse(expr, tz)
    except InvalidSpec:
        return
    now = datetime.now(UTC)
    first = cron.after(now)
    assert first is not None and first > now


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(st.text(max_size=40) | st.sampled_from(["../../etc/passwd", "/UTC", "Europe/",
                                              "posixrules", "Etc/GMT+14", "utc"]))
def test_a_time_zone_is_one_of_the_database_or_invalid_input(name: str) -> None:
    try:
        assert zone(name).key == name
    except InvalidSpec:
        pass


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(st.text(max_size=40))
def test_a_bulk_time_parses_or_is_invalid_input(text: str) -> None:
    try:
        parse_time(text, "--after")
    except InvalidSpec:
        pass


def test_never_firing_expressions_are_refused() -> None:
    for expr in ("0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 2 *"):
        with pytest.raises(InvalidSpec):
            Cron.parse(expr)
    assert Cron.parse("0 0 29 2 *").after(datetime(2025, 1, 1, tzinfo=UTC)) == datetime(
        2028, 2, 29, tzinfo=UTC)  # a leap day is years away, but it comes


def test_the_due_tick_is_the_latest_and_never_before_the_expected() -> None:
    cron = Cron.parse("*/10 * * * *")
    t = datetime(2025, 1, 1, 0, 10, tzinfo=UTC)
    assert due_tick(cron, t, t + timedelta(minutes=5)) == (t, t + timedelta(minutes=10))
    assert due_tick(cron, t, t + timedelta(minutes=35)) == (
        t + timedelta(minutes=30), t + timedelta(minutes=40))
    # A clock behind the expected tick never enqueues an earlier one.
    assert due_tick(cron, t, t - timedelta(minutes=3))[0] == t


def test_a_schedule_spec_is_one_repeatable_job() -> None:
    spec, shown = schedule_spec({"actions": [{"name": "sleep", "params": {"seconds": 1}}],
                                 "delay": "PT5M"})
    assert shown["delay"] == "PT5M" and spec.delay == timedelta(minutes=5)
    for bad in ({"actions": [{"name": "sleep"}], "run_at": "2030-01-01T00:00:00Z"},
                {"actions": [{"name": "sleep"}], "inputs": "s3://b/p"}, [], "x"):
        with pytest.raises(InvalidSpec):
            schedule_spec(bad)


def test_histogram_quantiles_interpolate_within_buckets() -> None:
    buckets = [(1.0, 0.0), (5.0, 8.0), (10.0, 2.0), (float("inf"), 0.0)]
    assert quantile(0.5, buckets) == pytest.approx(1 + 4 * 5 / 8)
    assert quantile(0.95, buckets) == pytest.approx(5 + 5 * 1.5 / 2)
    assert quantile(0.5, []) is None
    assert quantile(0.99, [(1.0, 1.0), (float("inf"), 99.0)]) == 1.0


def test_minutes_fill_the_hour_and_flags_say_what_is_wrong() -> None:
    since = datetime(2025, 1, 1, 0, 0, tzinfo=UTC)
    rows = [{"minute": since + timedelta(minutes=2), "name": "finished", "label": "failed",
             "le": float("inf"), "value": 2.0}]
    out = minutes(rows, since, 5)
    assert [m["finished"] for m in out] == [{}, {}, {"failed": 2}, {}, {}]
    assert out[0]["run_p50"] is None
    q = {"pending": 3, "oldest_ready_age_seconds": 900, "paused": False}
    assert flags(q, None, since, ever_claimed=False) == {
        "stalled": True, "never_served": True, "last_claim_at": None}
    assert flags(q, since - timedelta(minutes=1), since, ever_claimed=True)["stalled"] is False


def test_env_values_are_masked_and_the_summary_is_one_line() -> None:
    params = {"argv": ["sh", "-c", "echo 'a b'\nexit 1"], "env": {"TOKEN": "s3cr3t"}}
    assert shown_params(params) == {"argv": params["argv"], "env": {"TOKEN": MASK}}
    assert params["env"] == {"TOKEN": "s3cr3t"}  # the job's own params are untouched
    line = summary([{"name": "command", "params": params}, {"name": "sleep"}])
    assert "\n" not in line and line.endswith("(+1)") and "s3cr3t" not in line
    plugin = summary([{"name": "export", "params": {"table": "x" * 200, "env": {"K": "v"}}}])
    assert len(plugin) == 80 and '"v"' not in plugin
