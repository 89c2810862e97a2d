"""A periodic function's run knows from its own environment whether a schedule or a person
started it: the Job's name, from the pod's label through the downward API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobfence.passes.harness import detect_trigger, scheduled_job_name
from jobfence.settings import Settings

NOW = datetime(2026, 11, 25, 9, 30, tzinfo=UTC)
TICK = int(NOW.timestamp() // 60)


@pytest.mark.parametrize(("name", "scheduled"), [
    (f"jobfence-sweeper-{TICK}", True),            # the CronJob controller's, this minute
    (f"jobfence-sweeper-{TICK - 60 * 20}", True),  # a retry of a tick 20 hours ago
    (f"jobfence-sweeper-{TICK + 2}", True),        # a clock a little ahead
    ("once", False),                               # kubectl create job --from=cronjob/...
    ("manual-sweep-1", False),
    ("jobfence-sweeper-manual-20261125093000", False),  # the console's trigger
    (f"jobfence-sweeper-{TICK - 60 * 24 * 3}", False),  # no tick runs three days late
    ("jobfence-sweeper-29384756", False),          # the minute of a tick in 2025
    ("sweep-", False),
])
def test_a_tick_job_is_named_after_its_scheduled_minute(name: str, scheduled: bool) -> None:
    assert scheduled_job_name(name, NOW) is scheduled


def test_the_job_name_decides_in_a_pod() -> None:
    s = Settings(database_url="postgresql://x@localhost/x", cluster="kubernetes")
    assert detect_trigger(s.model_copy(update={"job_name": f"jobfence-lifecycle-{TICK}"}),
                          NOW) == "scheduled"
    assert detect_trigger(s.model_copy(update={"job_name": "once"}), NOW) == "manual"
    assert detect_trigger(s.model_copy(update={"job_name": f"jobfence-lifecycle-{TICK}",
                                               "triggered_by": "ana"}), NOW) == "manual"
    assert detect_trigger(s.model_copy(update={"job_name": "once", "trigger": "scheduled"}),
                          NOW) == "scheduled"


def test_a_tick_may_be_late_by_its_deadlines_but_not_by_days() -> None:
    late = NOW + timedelta(hours=23)
    assert scheduled_job_name(f"x-{TICK}", late)
    assert not scheduled_job_name(f"x-{TICK}", NOW + timedelta(days=2))
