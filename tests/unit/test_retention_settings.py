"""Retention settings are ISO 8601 durations read by the real parser: defaults, every form
a string-slicing parser misses, and a clear ConfigError naming the variable otherwise."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobfence.errors import ConfigError
from jobfence.settings import load_settings


def test_defaults_keep_jobs_a_month_and_the_audit_trail_a_quarter() -> None:
    s = load_settings(database_url="postgresql://x")
    assert s.retention_default == timedelta(days=30)
    assert s.audit_retention == timedelta(days=90)
    assert s.function_runs_retention == timedelta(days=30)


@pytest.mark.parametrize(("text", "expected"), [
    ("PT1H30M", timedelta(minutes=90)), ("P1DT12H", timedelta(hours=36)),
    ("PT0.5S", timedelta(seconds=0.5)), ("P2W", timedelta(weeks=2)), ("P7D", timedelta(days=7)),
])
def test_retention_reads_every_iso_8601_form_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, text: str, expected: timedelta) -> None:
    monkeypatch.setenv("JOBFENCE_RETENTION_DEFAULT", text)
    monkeypatch.setenv("JOBFENCE_AUDIT_RETENTION", text)
    monkeypatch.setenv("JOBFENCE_FUNCTION_RUNS_RETENTION", text)
    s = load_settings(database_url="postgresql://x")
    assert s.retention_default == s.audit_retention == s.function_runs_retention == expected


@pytest.mark.parametrize("text", ["30", "30 days", "P", "PT0S", "P1X"])
def test_a_bad_retention_is_a_config_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("JOBFENCE_AUDIT_RETENTION", text)
    with pytest.raises(ConfigError, match=r"^JOBFENCE_AUDIT_RETENTION .*duration"):
        load_settings(database_url="postgresql://x")
