"""Value types of the store's newer nouns (schedules, bulk actions, retention): rows come
back as these, like the ones in ``jobfence.store.types``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID


class ScheduleRow(NamedTuple):
    """One schedule as ``schedule show`` reads it."""

    schedule_id: UUID
    name: str
    cron: str
    timezone: str
    spec: dict[str, Any]
    paused: bool
    next_tick_at: datetime
    last_tick_at: datetime | None
    last_job_id: UUID | None
    created_at: datetime
    created_by: str | None
    changed_at: datetime
    changed_by: str | None


class DueSchedule(NamedTuple):
    """A schedule whose next tick has come, as the pass reads it."""

    schedule_id: UUID
    name: str
    cron: str
    timezone: str
    next_tick_at: datetime
    queue: str = "default"
    """The queue of the job it enqueues."""


class Fired(NamedTuple):
    """A tick the pass enqueued (or recorded as skipped): ``outcome`` is ``enqueued``,
    ``resource_busy`` or ``exists``."""

    schedule_id: UUID
    name: str
    tick_at: datetime
    job_id: UUID | None
    outcome: str


class TickRecord(NamedTuple):
    """A schedule's recorded tick."""

    tick_at: datetime
    job_id: UUID | None
    outcome: str
    at: datetime


class Selected(NamedTuple):
    """A job of a bulk selection."""

    job_id: UUID
    status: str
    queue: str


class Acted(NamedTuple):
    """What a bulk retry or cancel did to one job: ``refusal`` None when it was done."""

    job_id: UUID
    status: str | None
    refusal: str | None


class RetentionCandidate(NamedTuple):
    """A top-level terminal job whose retention has run out."""

    job_id: UUID
    is_parent: bool
    has_outputs: bool
    """Whether an attempt registered outputs: only then can it own objects on S3 (outputs
    are registered under the fence before they are uploaded)."""
    due: datetime
    """Its place in the retention order (retain_until, or finished_at without a ttl)."""
