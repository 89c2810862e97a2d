"""Job ids are UUIDv7: time-ordered, so the primary key doubles as creation order."""

from __future__ import annotations

import time

import pytest

from jobfence.ids import parse_job_id, uuid7


def test_uuid7_is_version_7_and_time_ordered() -> None:
    first = uuid7()
    time.sleep(0.002)
    second = uuid7()
    assert first.version == 7 and first.variant == "specified in RFC 4122"
    assert first < second
    assert len({uuid7() for _ in range(10_000)}) == 10_000


def test_parse_job_id() -> None:
    u = uuid7()
    assert parse_job_id(f" {u} ") == u
    with pytest.raises(ValueError, match="not a job id"):
        parse_job_id("nope")
