"""Schedules of users' own work: added, paused, resumed and deleted by operators (each
recorded in ``control_events``), read by ``schedule list|show``, and fired by the
``schedules`` pass — each due tick enqueued exactly once (migration 0021)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from jobfence import db
from jobfence.errors import Conflict, JobNotFound, NotFound
from jobfence.store.base import Noun


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


class Schedules(Noun):
    sql_file = "schedules.sql"

    def add(self, *, name: str, cron: str, timezone: str, spec: dict[str, Any],
            job: dict[str, Any], next_tick_at: datetime, actor: str) -> ScheduleRow:
        """A new schedule whose first tick is ``next_tick_at``; ``Conflict`` when the name
        is taken."""
        try:
            with db.transaction(self.conn):
                row = self._row("add", {"name": name, "cron": cron, "timezone": timezone,
                                        "spec": json.dumps(spec), "job": json.dumps(job),
                                        "next_tick_at": next_tick_at, "actor": actor},
                                ScheduleRow)
        except Conflict:
            raise Conflict(f"a schedule named {name!r} exists already (delete it first, or "
                           "choose another name)") from None
        assert row is not None
        return row

    def set_paused(self, *, name: str, paused: bool, next_tick_at: datetime | None,
                   actor: str) -> ScheduleRow:
        """Pause or resume; a resume starts from ``next_tick_at`` (no tick that fell while
        paused is caught up). ``NotFound`` when there is no such schedule."""
        try:
            with db.transaction(self.conn):
                row = self._row("set_paused", {"name": name, "paused": paused,
                                               "next_tick_at": next_tick_at, "actor": actor},
                                ScheduleRow)
        except JobNotFound:
            raise NotFound(f"no schedule named {name[:80]!r}") from None
        assert row is not None
        return row

    def delete(self, *, name: str, actor: str) -> ScheduleRow:
        """Delete a schedule and its ticks' record (its jobs stay); ``NotFound``."""
        try:
            with db.transaction(self.conn):
                row = self._row("delete", {"name": name, "actor": actor}, ScheduleRow)
        except JobNotFound:
            raise NotFound(f"no schedule named {name[:80]!r}") from None
        assert row is not None
        return row

    def get(self, name: str) -> ScheduleRow:
        row = self._row("get", {"name": name}, ScheduleRow)
        if row is None:
            raise NotFound(f"no schedule named {name[:80]!r}")
        return row

    def page(self, *, after: str | None = None, limit: int = 500) -> list[ScheduleRow]:
        return self._rows("page", {"after": after, "limit": limit}, ScheduleRow)

    def ticks(self, name: str, *, limit: int = 20) -> list[TickRecord]:
        return self._rows("ticks", {"name": name, "limit": limit}, TickRecord)

    def due(self, *, limit: int, after: DueSchedule | None = None,
            now: datetime | None = None) -> list[DueSchedule]:
        """A batch of schedules whose next tick has come, oldest first, after ``after``."""
        return self._rows("due", {
            "limit": limit, "now": now,
            "after_tick": after.next_tick_at if after else None,
            "after_id": after.schedule_id if after else None}, DueSchedule)

    def fire(self, ticks: Sequence[tuple[DueSchedule, datetime, datetime, UUID]],
             traceparent: str | None = None) -> list[Fired]:
        """Enqueue each (schedule as read, tick, the tick after it, a new job id) in one
        statement, the jobs carrying ``traceparent`` (the pass's producer span): a schedule
        another run moved on meanwhile answers nothing. Nothing at all while draining."""
        with db.transaction(self.conn):
            return self._rows("fire", {
                "schedule_ids": [d.schedule_id for d, *_ in ticks],
                "expected": [d.next_tick_at for d, *_ in ticks],
                "ticks": [t for _, t, _, _ in ticks],
                "following": [f for _, _, f, _ in ticks],
                "job_ids": [j for *_, j in ticks],
                "traceparents": [traceparent] * len(ticks)}, Fired)

    def clock(self) -> datetime:
        row = self._one("clock")
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]
