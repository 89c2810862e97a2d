"""The store's values: what goes in (new jobs, an action's outcome, a retry policy), as
frozen dataclasses, and what comes back — rows as NamedTuples, their fields named like the
columns of the statement that returns them (ten times cheaper to define than a dataclass:
a short-lived function defines them all at every start)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

from jobfence.limits import MAX_DETAIL_CHARS, storable_json, storable_text

ACTIVE = ("waiting", "pending", "running")
TERMINAL = ("succeeded", "failed", "cancelled")


class NewJob(NamedTuple):
    """A validated job ready to insert (see jobfence.spec / jobfence.functions.enqueue): a
    tuple, made three times faster than a frozen dataclass (an enqueue makes one per job)."""

    job_id: UUID
    actions: list[dict[str, Any]]
    max_attempts: int
    resource: str | None = None
    priority: int = 0
    after: tuple[UUID, ...] = ()
    parent_id: UUID | None = None
    is_parent: bool = False
    inputs: Any = None
    labels: dict[str, str] = {}  # never changed: a job's own is a copy
    ttl_seconds: float | None = None
    timeout_seconds: float | None = None
    expires_in_seconds: float | None = None
    idempotency_key: str | None = None
    spec_hash: str | None = None
    waiting: bool = False
    queue: str = "default"
    run_at: datetime | None = None
    delay_seconds: float | None = None
    traceparent: str | None = None  # the enqueue's W3C traceparent; a datum's, its parent's
    group_key: str | None = None
    workflow_id: str | None = None  # the workflow and step the job is (jobfence.workflows)
    step: str | None = None

    @property
    def status(self) -> str:
        """Where a new job starts: waiting on dependencies (or on its parent); a datum
        parent runs from the start (it is never claimed); anything else is pending."""
        if self.after or self.waiting:
            return "waiting"
        return "running" if self.is_parent else "pending"

    def row(self) -> dict[str, Any]:
        """The job as ``insert_many`` reads it: a field left out is NULL there, so what is
        unset is left out (the JSON of a large enqueue is most of its client's time)."""
        row: dict[str, Any] = {
            "job_id": str(self.job_id),
            "status": self.status,
            "actions": self.actions,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "is_parent": self.is_parent,
            "queue": self.queue,
        }
        if self.labels:
            row["labels"] = self.labels
        for name in _SOMETIMES:
            value = getattr(self, name)
            if value is not None:
                row[name] = value
        if self.parent_id is not None:
            row["parent_id"] = str(self.parent_id)
        if self.run_at is not None:
            row["run_at"] = self.run_at.isoformat()
        if self.after:
            row["after"] = [str(d) for d in self.after]
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> NewJob:
        """The job ``row`` was made of."""
        after = tuple(UUID(d) for d in row.get("after", ()))
        return cls(
            job_id=UUID(row["job_id"]), actions=row["actions"],
            max_attempts=row["max_attempts"], priority=row["priority"],
            is_parent=row["is_parent"], queue=row["queue"], labels=row.get("labels", {}),
            after=after, waiting=row["status"] == "waiting" and not after,
            parent_id=UUID(row["parent_id"]) if "parent_id" in row else None,
            run_at=datetime.fromisoformat(row["run_at"]) if "run_at" in row else None,
            **{name: row.get(name) for name in _SOMETIMES})


_SOMETIMES = ("resource", "inputs", "ttl_seconds", "timeout_seconds", "expires_in_seconds",
              "idempotency_key", "spec_hash", "delay_seconds", "traceparent", "group_key",
              "workflow_id", "step")
"""The fields of a new job's row written only when set."""


class Enqueued(NamedTuple):
    """What became of one spec of an enqueue (a tuple: one is made per job)."""

    job_id: UUID
    status: str
    created: bool = True
    """False when an idempotency key matched an existing job with the same spec."""
    children: int | None = None
    """For a datum parent: how many children this call created."""


ChildBatches = Callable[[NewJob], Iterable[Sequence[NewJob]]]
"""Makes a parent's children, batch by batch (e.g. from an S3 listing)."""


class Claim(NamedTuple):
    job_id: UUID
    attempt_id: UUID
    attempt_count: int
    max_attempts: int
    actions: list[dict[str, Any]]
    inputs: Any
    parent_id: UUID | None
    lease_expires_at: datetime
    run_deadline_at: datetime | None
    interruptions: int = 0
    """Earlier claims of this job given back without spending an attempt (SIGTERMs and
    snoozes): a claim after one may resume after the actions it finished."""
    sent: float | None = None
    """The claimer's monotonic clock at sending (not a column): a local deadline counted from
    it falls before the database's, however long the answer took."""

    @property
    def may_resume(self) -> bool:
        """Whether an earlier claim may have finished some actions."""
        return self.attempt_count > 1 or self.interruptions > 0


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """How one action of an attempt ended."""

    index: int
    name: str
    succeeded: bool
    started_at: datetime
    result: Any = None
    error: str | None = None
    error_detail: str | None = None
    snoozed: bool = False  # asked to run again later: stored as neither done nor failed

    def params(self, prefix: str = "") -> dict[str, Any]:
        """Query parameters, made storable; ``prefix="action_"`` where they sit beside the
        job's own."""
        return {"action_index": self.index, f"{prefix}name": storable_text(self.name, 200),
                f"{prefix}status": ("snoozed" if self.snoozed
                                    else "succeeded" if self.succeeded else "failed"),
                f"{prefix}started_at": self.started_at,
                f"{prefix}result": storable_json(self.result),
                f"{prefix}error": storable_text(self.error),
                f"{prefix}error_detail": storable_text(self.error_detail, MAX_DETAIL_CHARS)}


NO_OUTCOME = {"action_index": None, "action_name": None, "action_status": None,
              "action_started_at": None, "action_result": None, "action_error": None,
              "action_error_detail": None}


class Transition(NamedTuple):
    """A job that a verb moved, and where to."""

    job_id: UUID
    status: str
    parent_id: UUID | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class Moved(NamedTuple):
    """What a verb that moves jobs did (``done``) and, once that committed, what waited on
    the jobs it made terminal and was released or failed with them (``dependents``): the
    one settle rule, ``Noun._settle``."""

    done: list[Transition]
    dependents: list[Transition]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry delay: base * 2^(attempt-1), capped, jittered (SQL: jobfence_retry_delay)."""

    base_seconds: float = 10.0
    cap_seconds: float = 3600.0

    def params(self) -> dict[str, float]:
        return {"base_seconds": self.base_seconds, "cap_seconds": self.cap_seconds}


IMMEDIATE = RetryPolicy(0.0, 0.0)


class JobRow(NamedTuple):
    """One job as ``status`` and ``list`` read it."""

    job_id: UUID
    status: str
    actions: list[dict[str, Any]]
    resource: str | None
    priority: int
    max_attempts: int
    attempt_count: int
    visible_at: datetime
    attempt_id: UUID | None
    claimed_by: str | None
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    run_deadline_at: datetime | None
    parent_id: UUID | None
    is_parent: bool
    inputs: Any
    labels: dict[str, str]
    ttl: timedelta | None
    timeout: timedelta | None
    expires_at: datetime | None
    idempotency_key: str | None
    reason: str | None
    error: str | None
    error_detail: str | None
    manifest: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    interruptions: int
    snoozes: int
    queue: str
    run_at: datetime | None
    stopping_until: datetime | None
    """While a cancelled (or timed-out) attempt's command is not yet confirmed gone: the end
    of its lease, until which the job keeps its resource and is not run again."""
    after: list[UUID]
    run: int = 0
    """The job's run: 0 for the one its enqueue began, one more for each operator retry."""
    group: str | None = None  # the job's group (tenant) within its queue

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class Fence(NamedTuple):
    """Where a job's fence stands for the attempt asking: its status, whether that attempt
    holds the fence, and why (never whose the fence is)."""

    status: str
    holds: bool
    reason: str | None


class ActionResult(NamedTuple):
    """One recorded action result of one attempt."""

    job_id: UUID
    attempt_id: UUID
    action_index: int
    name: str
    status: str
    started_at: datetime
    finished_at: datetime
    result: Any
    error: str | None
    error_detail: str | None = None
    run: int = 0  # the job's run the result belongs to (JobRow.run)


class JobEvent(NamedTuple):
    """One entry of a job's audit trail."""

    event_id: int
    from_status: str | None
    to_status: str
    attempt_id: UUID | None
    reason: str | None
    at: datetime
    attempt: int | None = None
    """For a claim: the attempt count it ran as (as ``status`` numbers it), else None."""


class DrainState(NamedTuple):
    draining: bool
    drain_changed_at: datetime
    drain_reason: str | None


class Identity(NamedTuple):
    """Which installation a database belongs to (see migration 0011)."""

    installation: str | None
    identified_at: datetime | None


class Connections(NamedTuple):
    """The server's client connections in use, and how many a non-superuser may open
    (``max_connections`` less ``superuser_reserved_connections``)."""

    in_use: int
    available: int


class QueueStatus(NamedTuple):
    """A queue's settings and its active jobs."""

    queue: str
    paused: bool
    limit: int | None
    pending: int
    scheduled: int
    running: int
    waiting: int
    oldest_ready_age_seconds: float
    # Its rate: at most rate_limit starts in any window of the period; rate_started in the last
    rate_limit: int | None = None
    rate_period_seconds: float | None = None
    rate_started: int | None = None
    # At most group_limit running jobs of each group (tenant); fair: round-robin across groups
    group_limit: int | None = None
    fair: bool = False


class GroupStatus(NamedTuple):
    """One group (tenant) of a queue and its active jobs; None: the jobs without one."""

    group: str | None
    pending: int
    scheduled: int
    running: int
    waiting: int


class FunctionTrigger(NamedTuple):
    """A manual trigger of a periodic function: who, why, and what the cluster made of it."""

    trigger_id: int
    function: str
    requested_by: str
    reason: str
    requested_at: datetime
    outcome: str
    """requested (the cluster is being asked), created (its Job exists) or failed."""
    job_name: str | None
    error: str | None


class JobMetric(NamedTuple):
    """One total of the job metrics (``jobfence.store.job_metrics``)."""

    queue: str
    name: str
    """finished, attempts; a histogram (wait, run, lifecycle_lag, finalize_lag) or its sum
    (wait_sum, ...)."""
    label: str
    """finished: the status; attempts: the outcome; lifecycle_lag: what was enforced
    (timeout, expiry, retention); '' otherwise."""
    le: float
    """a histogram: the bucket's upper bound (per bucket, not cumulative); +Inf otherwise."""
    value: float


class ChildEntry(NamedTuple):
    """A parent's child as its manifest lists it."""

    job_id: UUID
    status: str
    attempt_id: UUID | None
    inputs: Any
    error: str | None
    outputs: list[str]


class ParentSummary(NamedTuple):
    """A parent as finalized: ``counts`` (children by status) once no child is active."""

    job_id: UUID
    status: str
    inputs: Any
    active: bool
    counts: dict[str, int] | None


class ChildError(NamedTuple):
    job_id: UUID
    status: str
    error: str | None


class PodRef(NamedTuple):
    """A worker pod of a pass's snapshot, by name, with the Job that owns it, and the uids
    the listing saw (the preconditions of a delete)."""

    name: str
    job_name: str | None
    uid: str | None = None
    job_uid: str | None = None


class Suspect(NamedTuple):
    """A pod seen without a live claim, and since when."""

    name: str
    job_name: str | None
    first_seen: datetime
    uid: str | None = None
    job_uid: str | None = None


def transitions(rows: Iterable[dict[str, Any]]) -> list[Transition]:
    """Transitions from rows with job_id, status and (maybe) parent_id."""
    return [Transition(r["job_id"], r["status"], r.get("parent_id")) for r in rows]
