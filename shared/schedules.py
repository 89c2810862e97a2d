"""Schedules of users' own work: a cron expression in a time zone, and the job it enqueues at
each tick. Everything a schedule is made of is checked here before anything is written
(exit 2): a name, a five-field cron expression that fires (evaluated by ``cronsim``, which
follows Debian's cron across daylight-saving changes), a time zone of the tz database, and
one job spec that can be enqueued again and again.

Daylight saving, as cron does it (``cronsim``): a job at a fixed local time that falls in
the hour skipped in spring runs at the first minute after the gap; one in the hour repeated
in autumn runs once, the first time. A schedule whose minute or hour field is a wildcard
(``*/15 * * * *``) runs by the clock, every 15 real minutes across the change.

Ticks are instants (UTC); the pass asks ``due_tick`` for the latest tick not after now —
at most one missed tick is caught up after an outage — and the tick after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jobfence.errors import InvalidSpec
from jobfence.limits import MAX_DURATION, queue_name
from jobfence.spec import JobSpec

SCHEDULE_LABEL = "jobfence.io/schedule"
"""The label every job of a schedule carries (``list --label jobfence.io/schedule=NAME``)."""

CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,\-#LW?]{1,100}$")
TIMEZONE = re.compile(r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+){0,3}$")
REFUSED_SPEC_FIELDS = {
    "after": "a schedule's job cannot wait on fixed jobs",
    "inputs": "a schedule's job cannot have S3 inputs (not yet)",
    "idempotency_key": "a schedule's job gets its idempotency key from the schedule and the "
                       "tick",
    "run_at": "a schedule's job runs at its ticks (a delay after the tick is fine)",
}


def schedule_name(value: str) -> str:
    """``value`` if it can name a schedule (a DNS label, as a queue's name)."""
    try:
        return queue_name(value)
    except ValueError as exc:
        raise InvalidSpec(str(exc).replace("queue name", "schedule name")) from None


def zone(name: str) -> ZoneInfo:
    """The time zone of the tz database called ``name`` (``Europe/Riga``, ``UTC``)."""
    if not TIMEZONE.fullmatch(name) or ".." in name:
        raise InvalidSpec(f"timezone {name[:60]!r}: not a time zone name (e.g. UTC, "
                          "Europe/Riga, America/New_York)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSpec(f"timezone {name[:60]!r}: no such time zone in the tz "
                          "database") from None


@dataclass(frozen=True)
class Cron:
    """A five-field cron expression evaluated in a time zone."""

    expr: str
    tz: ZoneInfo

    @classmethod
    def parse(cls, expr: str, timezone: str = "UTC") -> Cron:
        """InvalidSpec unless ``expr`` is five cron fields that fire within 100 years."""
        from cronsim import CronSimError

        tz = zone(timezone)
        fields = expr.split()
        if len(fields) != 5 or not all(CRON_FIELD.fullmatch(f) for f in fields):
            raise InvalidSpec(f"cron {expr[:80]!r}: expected five fields (minute hour "
                              "day-of-month month day-of-week), e.g. '30 2 * * *'")
        cron = cls(" ".join(fields), tz)
        now = datetime.now(UTC)
        try:
            first = cron.after(now)
        except (CronSimError, ValueError, OverflowError, StopIteration) as exc:
            raise InvalidSpec(f"cron {expr[:80]!r}: {exc or 'it never fires'}") from None
        if first is None:
            raise InvalidSpec(f"cron {expr[:80]!r}: it never fires (no tick within 100 "
                              "years)")
        return cron

    def after(self, instant: datetime) -> datetime | None:
        """The first tick strictly after ``instant`` (UTC), or None within 100 years."""
        from cronsim import CronSim

        it = CronSim(self.expr, instant.astimezone(self.tz))
        limit = instant + MAX_DURATION
        for _ in range(10):  # an ambiguous local time may first come out before `instant`
            tick = next(it).astimezone(UTC)
            if tick > limit:
                return None
            if tick > instant:
                return tick
        return None

    def latest(self, instant: datetime) -> datetime | None:
        """The last tick not after ``instant`` (UTC), or None."""
        from cronsim import CronSim

        start = (instant.replace(microsecond=0) + timedelta(seconds=1)).astimezone(self.tz)
        try:
            tick = next(CronSim(self.expr, start, reverse=True)).astimezone(UTC)
        except (StopIteration, ValueError, OverflowError):
            return None
        return tick if tick <= instant else None


def due_tick(cron: Cron, expected: datetime, now: datetime) -> tuple[datetime, datetime]:
    """(the tick to enqueue, the tick after it) for a schedule whose next tick ``expected``
    has come by ``now``: the latest tick not after now — one missed tick is caught up,
    never more — and never one before ``expected``."""
    latest = cron.latest(now)
    tick = expected if latest is None or latest < expected else latest
    following = cron.after(max(tick, now))
    if following is None:  # no tick within 100 years: park it there
        following = now + MAX_DURATION
    return tick, following


def job_template(spec: JobSpec, name: str, max_attempts: int) -> dict[str, Any]:
    """What the schedule stores of its job: the columns ``scheduler_fire`` inserts from
    (every tick's job is made from it, by the database)."""
    from jobfence.spec import seconds

    labels = {**spec.labels, SCHEDULE_LABEL: name}
    if len(labels) > 64:
        raise InvalidSpec("spec: labels: at most 63 labels (a schedule adds "
                          f"{SCHEDULE_LABEL})")
    job = {"actions": spec.stored_actions(), "resource": spec.resource,
           "priority": spec.priority, "max_attempts": spec.max_attempts or max_attempts,
           "labels": labels, "ttl_seconds": seconds(spec.ttl),
           "timeout_seconds": seconds(spec.timeout),
           "expires_in_seconds": seconds(spec.expires_in),
           "spec_hash": spec.fingerprint(), "queue": spec.queue,
           "delay_seconds": seconds(spec.delay)}
    if spec.group is not None:  # a schedule stored before groups has none
        job["group_key"] = spec.group
    return job


def schedule_spec(data: object) -> tuple[JobSpec, dict[str, Any]]:
    """The one job spec of a schedule, validated as ``enqueue`` validates it, and what is
    kept of it to show; InvalidSpec for a list, or a field a repeated job cannot have."""
    from jobfence.spec import parse_specs

    if isinstance(data, list):
        if len(data) != 1:
            raise InvalidSpec("a schedule enqueues one job spec, not a list")
        data = data[0]
    if isinstance(data, dict):
        for key, why in REFUSED_SPEC_FIELDS.items():
            if data.get(key) not in (None, [], {}):
                raise InvalidSpec(f"spec: {key}: {why}")
    [spec] = parse_specs(data)
    return spec, spec.model_dump(mode="json", exclude_defaults=True)
