"""schedules: enqueue each due tick of users' schedules exactly once (a CronJob, every
minute).

A batch of due schedules at a time (``JOBFENCE_BATCH_SIZE``, oldest tick first, at most
``MAX_BATCHES`` a pass, ``jobfence.passes.budget``): for each, the tick to enqueue is the latest
one not after now — after an outage only the most recent missed tick is caught up, the
others are skipped — and the tick after it becomes the schedule's next. The database
enqueues the batch in one statement (``scheduler_fire``), moving each schedule on only from
the tick this pass read: two passes at once, or a pass beside a manual run, never enqueue a
tick twice, and the job's idempotency key (``schedule:NAME:TICK``) says so too. A tick
whose job's resource is still held by the previous tick's job is recorded as skipped. A
schedule whose stored job is not what ``schedule add`` makes of its spec (the database
judges it, migration 0035) is moved on, its tick recorded ``invalid``, counted and logged:
it never fires, and never stops the others.
Nothing is enqueued while drain mode is on; once it is off, the latest missed tick is
caught up.

Time is the database's clock (``Deps.now`` in tests), never the pod's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from uuid import UUID

from jobfence import tracing
from jobfence.errors import InvalidSpec
from jobfence.ids import uuid7
from jobfence.logs import get_logger
from jobfence.passes.budget import Budget
from jobfence.passes.harness import Deps, snapshot
from jobfence.schedules import Cron, due_tick, zone
from jobfence.settings import Settings
from jobfence.store import NewJob, Store
from jobfence.store.schedules import DueSchedule, Fired

log = get_logger("jobfence.schedules")


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    function: str
    due: int = 0
    enqueued: int = 0
    resource_busy: int = 0
    already_enqueued: int = 0
    invalid: int = 0
    caught_up: int = 0
    raced: int = 0
    errors: int = 0
    batches: int = 0
    draining: int = snapshot()


@lru_cache(maxsize=4096)
def _cron(expr: str, timezone: str) -> Cron:
    return Cron(expr, zone(timezone))


@lru_cache(maxsize=4096)
def _due(cron: Cron, expected: datetime, now: datetime) -> tuple[datetime, datetime]:
    """``due_tick``, once per distinct (expression, time zone, tick) of a pass: schedules
    share a few expressions (``0 * * * *``), and each evaluation walks the calendar."""
    return due_tick(cron, expected, now)


def _fire(settings: Settings, store: Store,
          ticks: list[tuple[DueSchedule, datetime, datetime, UUID]]) -> list[Fired]:
    """Enqueue a batch of ticks inside the enqueue's producer span, where this pass traces:
    the jobs carry its traceparent, as every enqueued job does."""
    made = [NewJob(job_id=job_id, actions=[], max_attempts=1, queue=d.queue)
            for d, _, _, job_id in ticks]
    with tracing.enqueue_span(settings) as traced:
        traced.sent(made)
        return store.schedules.fire(ticks, traced.traceparent)


def run_once(settings: Settings, deps: Deps) -> Report:
    store = deps.store
    if store.control.drain_status().draining:
        log.info("schedules_draining", message="drain mode is on: no tick is enqueued")
        return Report(function="schedules", draining=1)
    now = deps.now or store.schedules.clock()
    budget = Budget(checkpoint=deps.checkpoint)
    due = enqueued = busy = exists = caught_up = raced = errors = invalid = 0
    after: DueSchedule | None = None
    while budget:
        page = budget.batch(store.schedules.due, limit=settings.batch_size, after=after,
                            now=now)
        if not page:
            break
        due += len(page)
        ticks: list[tuple[DueSchedule, datetime, datetime, UUID]] = []
        for d in page:
            try:
                tick, following = _due(_cron(d.cron, d.timezone), d.next_tick_at, now)
            except (InvalidSpec, ValueError, OverflowError, StopIteration) as exc:
                errors += 1
                log.error("schedule_unreadable", schedule=d.name, error=str(exc))
                continue
            caught_up += tick != d.next_tick_at
            ticks.append((d, tick, following, uuid7()))
        fired = _fire(settings, store, ticks) if ticks else []
        raced += len(ticks) - len(fired)
        for f in fired:
            if f.outcome == "enqueued":
                enqueued += 1
                log.debug("tick_enqueued", schedule=f.name, tick=f.tick_at.isoformat(),
                          job_id=str(f.job_id))
            elif f.outcome == "invalid":  # not what `schedule add` stores: never run
                invalid += 1
                log.error("schedule_invalid", schedule=f.name, tick=f.tick_at.isoformat(),
                          reason="its stored job is not what schedule add makes of its spec "
                                 "(stored by hand?): skipped; delete and add it again")
            elif f.outcome == "resource_busy":
                busy += 1
                log.warning("tick_skipped", schedule=f.name, tick=f.tick_at.isoformat(),
                            reason="its resource is held by an active job")
            else:
                exists += 1
        log.info("ticks_enqueued", schedules=len(page), enqueued=sum(
            1 for f in fired if f.outcome == "enqueued"))
        after = page[-1]
        if len(page) < settings.batch_size:
            break
    return Report(function="schedules", due=due, enqueued=enqueued, resource_busy=busy,
                  already_enqueued=exists, invalid=invalid, caught_up=caught_up, raced=raced,
                  errors=errors,
                  batches=budget.batches)
