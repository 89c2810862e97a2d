"""The fenced store: every verb on jobs is one statement or one transaction, and every write
after a claim is predicated on the claim's ``attempt_id`` and reports whether it matched.

Callers never write SQL; they call these verbs with keyword arguments for ids and fences.
A verb that makes jobs terminal also settles what waited on them (``settle``), after its
own commit — a terminal write asks for its dependents in the same round trip, as a second
transaction after the first one's Sync. An enqueue with ``after`` never locks the jobs it
waits on (a running one keeps renewing its lease); it re-reads them after its own commit.
Each side reads after its own commit, so whichever commits last sees the other: no
dependent is left waiting by a race between an enqueue and a finish. (An enqueue inside an
application's transaction cannot read after that commit; ``export-finalize`` resolves what
it leaves waiting, at its next pass.)

Settling is bounded: a terminal write releases at most ``SETTLE_BATCH`` dependents inline;
a job with more leaves the rest to ``export-finalize``, which pages through them.

What a job produces (results, error texts) is made storable on the way in
(``shared.limits``): a job's output is never the reason its terminal write fails.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, LiteralString
from uuid import UUID

from psycopg.pq import TransactionStatus

from shared.db import Connection, translated
from shared.errors import (
    Drained,
    IdempotencyConflict,
    InvalidSpec,
    JobAlreadyTerminal,
    JobNotFound,
)
from shared.limits import MAX_DETAIL_CHARS, storable_json, storable_text
from shared.queries import QUERIES

ACTIVE = ("waiting", "pending", "running")
TERMINAL = ("succeeded", "failed", "cancelled")

SETTLE_BATCH = 1000
"""Dependents a verb releases inline after making jobs terminal; export-finalize pages
through the rest."""

RESOLVE_BATCH = 5000
"""Waiting jobs resolved per statement (linear in the batch: see migration 0007)."""


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated job ready to insert (see shared.spec / functions.enqueue)."""

    job_id: UUID
    actions: list[dict[str, Any]]
    max_attempts: int
    resource: str | None = None
    priority: int = 0
    after: tuple[UUID, ...] = ()
    parent_id: UUID | None = None
    is_parent: bool = False
    inputs: Any = None
    labels: dict[str, str] = field(default_factory=dict)
    ttl_seconds: float | None = None
    timeout_seconds: float | None = None
    expires_in_seconds: float | None = None
    idempotency_key: str | None = None
    spec_hash: str | None = None
    waiting: bool = False

    @property
    def status(self) -> str:
        """Where a new job starts: waiting on dependencies (or on its parent); a datum
        parent runs from the start (it is never claimed); anything else is pending."""
        if self.after or self.waiting:
            return "waiting"
        return "running" if self.is_parent else "pending"

    def row(self) -> dict[str, Any]:
        return {
            "job_id": str(self.job_id),
            "status": self.status,
            "actions": self.actions,
            "resource": self.resource,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "parent_id": str(self.parent_id) if self.parent_id else None,
            "is_parent": self.is_parent,
            "inputs": self.inputs,
            "labels": self.labels,
            "ttl_seconds": self.ttl_seconds,
            "timeout_seconds": self.timeout_seconds,
            "expires_in_seconds": self.expires_in_seconds,
            "idempotency_key": self.idempotency_key,
            "spec_hash": self.spec_hash,
            "reason": "enqueued",
        }


@dataclass(frozen=True, slots=True)
class Enqueued:
    job_id: UUID
    status: str
    created: bool = True
    """False when an idempotency key matched an existing job with the same spec."""
    children: int | None = None
    """For a datum parent: how many children this call created."""


ChildBatches = Callable[[NewJob], Iterable[Sequence[NewJob]]]
"""Makes a parent's children, batch by batch (e.g. from an S3 listing)."""


@dataclass(frozen=True, slots=True)
class Claim:
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
    """SIGTERMs this job took on earlier claims (their attempts were given back)."""

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

    def params(self, prefix: str = "") -> dict[str, Any]:
        """Query parameters, made storable; ``prefix="action_"`` where they sit beside the
        job's own."""
        return {"action_index": self.index, f"{prefix}name": storable_text(self.name, 200),
                f"{prefix}status": "succeeded" if self.succeeded else "failed",
                f"{prefix}started_at": self.started_at,
                f"{prefix}result": storable_json(self.result),
                f"{prefix}error": storable_text(self.error),
                f"{prefix}error_detail": storable_text(self.error_detail, MAX_DETAIL_CHARS)}


NO_OUTCOME = {"action_index": None, "action_name": None, "action_status": None,
              "action_started_at": None, "action_result": None, "action_error": None,
              "action_error_detail": None}


@dataclass(frozen=True, slots=True)
class Transition:
    """A job that a verb moved, and where to."""

    job_id: UUID
    status: str
    parent_id: UUID | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry delay: base * 2^(attempt-1), capped, jittered (SQL: jobfence_retry_delay)."""

    base_seconds: float = 10.0
    cap_seconds: float = 3600.0

    def params(self) -> dict[str, float]:
        return {"base_seconds": self.base_seconds, "cap_seconds": self.cap_seconds}


IMMEDIATE = RetryPolicy(0.0, 0.0)


@dataclass(frozen=True, slots=True)
class RetentionCandidate:
    """A top-level terminal job whose retention has run out."""

    job_id: UUID
    is_parent: bool
    has_outputs: bool
    """Whether an attempt registered outputs: only then can it own objects on S3 (outputs
    are registered under the fence before they are uploaded)."""
    due: datetime
    """Its place in the retention order (retain_until, or finished_at without a ttl)."""


def _transitions(rows: Iterable[dict[str, Any]]) -> list[Transition]:
    return [Transition(r["job_id"], r["status"], r.get("parent_id")) for r in rows]


def _texts(**values: str | None) -> dict[str, str | None]:
    """Reasons and errors made storable (error_detail gets the longer cap)."""
    return {k: storable_text(v, MAX_DETAIL_CHARS if k == "error_detail" else 2000)
            for k, v in values.items()}


def _chunks(items: Sequence[UUID], size: int) -> Iterator[Sequence[UUID]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


class FencedStore:
    """Domain verbs over one autocommit connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(self, jobs: Sequence[NewJob],
                children: ChildBatches | None = None) -> list[Enqueued]:
        """Insert jobs in one transaction, all or nothing; a parent's children are made by
        ``children`` and inserted batch by batch in the same transaction (memory stays
        bounded however many there are).

        Refused while draining (``Drained``); ``ResourceBusy`` when a resource is held by an
        active job (the unique index decides, race-free); a repeated idempotency key returns
        the existing job when the spec is the same and raises ``IdempotencyConflict`` when
        it is not; an ``after`` id that does not exist raises ``JobNotFound``.

        Inside a transaction the caller owns, everything is written in it (as savepoint) and
        the caller's commit makes it visible; otherwise in a transaction of its own.
        """
        owned = self.conn.info.transaction_status == TransactionStatus.IDLE
        after = sorted({d for job in jobs for d in job.after}, key=str)
        with translated(), self.conn.transaction():
            lock = self.conn.execute(QUERIES["control_drain_lock"]).fetchone()
            if lock and lock["draining"]:
                raise Drained("drain mode is on: enqueue is refused until `drain off`")
            finished = False
            if after:
                found = {r["job_id"]: r["status"] for r in self.conn.execute(
                    QUERIES["dependency_status"], {"job_ids": after})}
                missing = [d for d in after if d not in found]
                if missing:
                    raise JobNotFound(missing[0])
                finished = any(status in TERMINAL for status in found.values())
            inserted = {r["job_id"] for r in self.conn.execute(
                QUERIES["job_insert_many"],
                {"jobs": json.dumps([job.row() for job in jobs])})}
            results = self._idempotent_replays(jobs, inserted)
            if children is not None:
                results = [self._insert_children(r, j, children) if r.created and j.is_parent
                           else r for r, j in zip(results, jobs, strict=True)]
            deps = [{"job_id": str(j.job_id), "depends_on": str(d)}
                    for j in jobs if j.job_id in inserted for d in j.after]
            if deps:
                self.conn.execute(QUERIES["dependency_insert_many"],
                                  {"deps": json.dumps(deps)})
            waiting = [j.job_id for j in jobs if j.job_id in inserted and j.after]
            settled: dict[UUID, str] = {}
            if waiting and finished:  # some dependency had already finished
                settled = {t.job_id: t.status for t in self.resolve_waiting(waiting)}
        if waiting and owned:
            # A dependency may have finished after the check above: its own settle could
            # not see these rows. Read again, after this commit.
            still = [j for j in waiting if settled.get(j, "waiting") == "waiting"]
            if still and any(r["status"] in TERMINAL for r in self._dependency_status(after)):
                settled |= {t.job_id: t.status for t in self.resolve_waiting(still)}
        if settled:
            results = [Enqueued(r.job_id, settled.get(r.job_id, r.status), r.created,
                                r.children) for r in results]
        return results

    def _dependency_status(self, job_ids: Sequence[UUID]) -> list[dict[str, Any]]:
        with translated():
            return self.conn.execute(QUERIES["dependency_status"],
                                     {"job_ids": list(job_ids)}).fetchall()

    def _insert_children(self, parent: Enqueued, job: NewJob,
                         children: ChildBatches) -> Enqueued:
        count = 0
        for batch in children(job):
            self.conn.execute(QUERIES["job_insert_many"],
                              {"jobs": json.dumps([c.row() for c in batch])})
            count += len(batch)
        if count == 0:
            raise InvalidSpec(f"job {job.job_id}: its inputs matched no objects")
        return Enqueued(parent.job_id, parent.status, parent.created, count)

    def _idempotent_replays(self, jobs: Sequence[NewJob], inserted: set[UUID]) -> list[Enqueued]:
        replayed = [j for j in jobs if j.job_id not in inserted]
        existing: dict[str, dict[str, Any]] = {}
        if replayed:
            keys = [j.idempotency_key for j in replayed]
            existing = {r["idempotency_key"]: r for r in self.conn.execute(
                QUERIES["job_get_by_idempotency_keys"], {"keys": keys})}
        out = []
        for job in jobs:
            if job.job_id in inserted:
                out.append(Enqueued(job.job_id, job.status))
                continue
            row = existing.get(job.idempotency_key or "")
            if row is None:  # the other job was deleted between the two statements
                raise IdempotencyConflict(f"idempotency key {job.idempotency_key!r} "
                                          "changed hands during enqueue; try again")
            if row["spec_hash"] != job.spec_hash:
                raise IdempotencyConflict(
                    f"idempotency key {job.idempotency_key!r} was used by job "
                    f"{row['job_id']} with a different spec")
            out.append(Enqueued(row["job_id"], row["status"], created=False))
        return out

    # -- the life of an attempt ------------------------------------------------------------

    def claim(self, *, worker_id: str, lease_seconds: float, limit: int = 1) -> list[Claim]:
        """Claim up to ``limit`` ready jobs, each with a fresh fence; [] when drained/empty."""
        with translated():
            rows = self.conn.execute(
                QUERIES["job_claim"],
                {"worker_id": worker_id, "lease_seconds": lease_seconds, "limit": limit},
            ).fetchall()
        return [Claim(**row) for row in rows]

    def heartbeat(self, *, job_id: UUID, attempt_id: UUID,
                  lease_seconds: float) -> datetime | None:
        """Renew the lease; the new deadline, or None when the fence is lost."""
        with translated():
            row = self.conn.execute(
                QUERIES["attempt_heartbeat"],
                {"job_id": job_id, "attempt_id": attempt_id, "lease_seconds": lease_seconds},
            ).fetchone()
        return row["lease_expires_at"] if row else None

    def record_action(self, *, job_id: UUID, attempt_id: UUID, outcome: ActionOutcome) -> bool:
        """Record one action's outcome under the fence; False when the fence is lost."""
        with translated():
            row = self.conn.execute(QUERIES["attempt_action_record"],
                                    {"job_id": job_id, "attempt_id": attempt_id,
                                     **outcome.params()}).fetchone()
        return row is not None

    def finish(self, *, job_id: UUID, attempt_id: UUID, succeeded: bool,
               outcome: ActionOutcome | None = None, reason: str | None = None,
               error: str | None = None, error_detail: str | None = None) -> Transition | None:
        """Fenced terminal write, with the last action's outcome in the same statement;
        None when the fence is lost (nothing written). Its dependents are asked for in the
        same round trip, after its commit, and settled."""
        status = "succeeded" if succeeded else "failed"
        with translated():
            with self.conn.pipeline() as pipeline:
                fin = self.conn.execute(QUERIES["attempt_finish"], {
                    "job_id": job_id, "attempt_id": attempt_id, "status": status,
                    **_texts(reason=reason or status, error=error, error_detail=error_detail),
                    **(outcome.params("action_") if outcome else NO_OUTCOME)})
                pipeline.sync()  # the terminal write commits here
                deps = self._dependents_after(job_id)
            row = fin.fetchone()
        if row is None:
            return None
        done = _transitions([row])
        self._settle_found(done, list(dict.fromkeys(r["job_id"] for r in deps)))
        return done[0]

    def _dependents_after(self, job_id: UUID) -> Any:
        """The dependents query for a job just written, queued in a pipeline after a Sync:
        it runs after that commit (see the module's docstring)."""
        return self.conn.execute(QUERIES["dependency_dependents"],
                                 {"job_ids": [job_id], "limit": SETTLE_BATCH})

    def finish_and_claim(self, *, job_id: UUID, attempt_id: UUID,
                         outcome: ActionOutcome | None, worker_id: str,
                         lease_seconds: float) -> tuple[Transition | None, Claim | None]:
        """One attempt's successful terminal write and the claim of the next ready job, in
        one transaction: one round trip and one commit per job for a worker that runs many.
        Each job keeps its own fence; the terminal write is fenced exactly as ``finish``.
        The transition is None when the fence was lost; the claim None when nothing is
        ready (or draining)."""
        with translated():
            with self.conn.pipeline() as pipeline:
                # One implicit transaction up to the Sync: finish and claim commit together.
                fin = self.conn.execute(QUERIES["attempt_finish"], {
                    "job_id": job_id, "attempt_id": attempt_id, "status": "succeeded",
                    "reason": "succeeded", "error": None, "error_detail": None,
                    **(outcome.params("action_") if outcome else NO_OUTCOME)})
                nxt = self.conn.execute(QUERIES["job_claim"], {
                    "worker_id": worker_id, "lease_seconds": lease_seconds, "limit": 1})
                pipeline.sync()
                deps = self._dependents_after(job_id)
            row, claimed = fin.fetchone(), nxt.fetchone()
        claim = Claim(**claimed) if claimed else None
        if row is None:
            return None, claim
        done = _transitions([row])
        self._settle_found(done, list(dict.fromkeys(r["job_id"] for r in deps)))
        return done[0], claim

    def release(self, *, job_id: UUID, attempt_id: UUID, reason: str,
                retry: RetryPolicy, outcome: ActionOutcome | None = None,
                error: str | None = None, error_detail: str | None = None) -> Transition | None:
        """Fenced give-back: pending after the retry delay, or failed when attempts are
        exhausted; the failed action's outcome in the same statement. None when the fence
        is lost."""
        with translated():
            row = self.conn.execute(QUERIES["attempt_release"], {
                "job_id": job_id, "attempt_id": attempt_id, **retry.params(),
                **_texts(reason=reason, error=error, error_detail=error_detail),
                **(outcome.params("action_") if outcome else NO_OUTCOME),
            }).fetchone()
        if row is None:
            return None
        done = _transitions([row])
        self.settle(done)
        return done[0]

    def interrupt(self, *, job_id: UUID, attempt_id: UUID, reason: str,
                  max_interruptions: int) -> Transition | None:
        """Fenced give-back after SIGTERM: pending at once, the attempt not counted while
        the job has taken fewer than ``max_interruptions``; else as ``release``. None when
        the fence is lost."""
        with translated():
            row = self.conn.execute(QUERIES["attempt_interrupt"], {
                "job_id": job_id, "attempt_id": attempt_id,
                "reason": storable_text(reason), "max_interruptions": max_interruptions,
            }).fetchone()
        if row is None:
            return None
        done = _transitions([row])
        self.settle(done)
        return done[0]

    def fence(self, job_id: UUID) -> dict[str, Any] | None:
        """Status, attempt_id and reason of a job: who holds the fence now."""
        with translated():
            row: dict[str, Any] | None = self.conn.execute(
                QUERIES["job_fence_get"], {"job_id": job_id}).fetchone()
        return row

    def succeeded_actions(self, job_id: UUID) -> set[int]:
        """Indexes of the actions some attempt already finished: a retry resumes after them."""
        return {r["action_index"] for r in self.action_results([job_id])
                if r["status"] == "succeeded"}

    # -- operator verbs --------------------------------------------------------------------

    def cancel(self, *, job_id: UUID, reason: str = "cancelled") -> list[Transition]:
        """Cancel a job (and a parent's unfinished children); rotates every fence involved.

        ``JobNotFound`` if there is no such job, ``JobAlreadyTerminal`` if it has finished.
        """
        params = {"job_id": job_id, "reason": reason}
        with translated(), self.conn.transaction():
            # Children first: the same order a finishing child takes (child row, then
            # the parent), so cancel and finish never deadlock.
            children = self.conn.execute(QUERIES["job_cancel_children"], params).fetchall()
            row = self.conn.execute(QUERIES["job_cancel"], params).fetchone()
            if row is None:
                current = self.get(job_id)
                if current is None:
                    raise JobNotFound(job_id)
                raise JobAlreadyTerminal(f"job {job_id} is already {current['status']}")
        done = _transitions([*children, row])
        self.settle(done)
        return done

    def set_drain(self, *, on: bool, reason: str | None = None) -> dict[str, Any]:
        with translated():
            row = self.conn.execute(QUERIES["control_drain_set"],
                                    {"draining": on, "reason": reason}).fetchone()
        assert row is not None
        return row

    def drain_status(self) -> dict[str, Any]:
        with translated():
            row = self.conn.execute(QUERIES["control_drain_get"]).fetchone()
            running = self.conn.execute(QUERIES["jobs_running_count"]).fetchone()
        assert row is not None and running is not None
        return {**row, "running": running["n"], "scaler_value": self.scaler_value()}

    def scaler_value(self) -> int:
        """What the KEDA trigger sees: ready work plus live claims, 0 while draining."""
        with translated():
            row = self.conn.execute(QUERIES["queue_keda_count"]).fetchone()
        assert row is not None
        return int(row["value"])

    # -- periodic verbs --------------------------------------------------------------------

    def reclaim_expired(self, *, retry: RetryPolicy, batch_size: int,
                        now: datetime | None = None) -> list[Transition]:
        """One bounded batch of expired leases: fence rotated, back to pending with backoff
        or failed when attempts are exhausted. ``now`` defaults to the database's clock."""
        with translated():
            rows = self.conn.execute(QUERIES["lease_reclaim_expired"], {
                "batch_size": batch_size, "now": now, **retry.params()}).fetchall()
        done = _transitions(rows)
        self.settle(done)
        return done

    # -- runs of the periodic functions, and what metrics read -----------------------------

    def run_started(self, *, function: str, trigger: str, skipped: bool = False) -> int:
        """Record a function run (status running, or skipped when another run holds its
        lock); its run id. A skipped run also counts in the function's totals."""
        with translated(), self.conn.transaction():
            row = self.conn.execute(QUERIES["function_run_start"], {
                "function": function, "trigger": trigger,
                "status": "skipped" if skipped else "running",
                "host": socket.gethostname()}).fetchone()
            if skipped:
                self.conn.execute(QUERIES["function_totals_add"], {
                    "function": function, "totals": json.dumps({"run:skipped": 1})})
        assert row is not None
        return int(row["run_id"])

    def run_finished(self, *, run_id: int, function: str, trigger: str, succeeded: bool,
                     counts: dict[str, Any], duration_seconds: float,
                     error: str | None = None) -> None:
        """Close a run, add its numeric counts to the function's totals and set its last
        status (the last success survives failed runs), in one transaction."""
        status = "succeeded" if succeeded else "failed"
        totals: dict[str, float] = {f"run:{status}": 1}
        totals.update({k: v for k, v in counts.items()
                       if isinstance(v, int | float) and not isinstance(v, bool)})
        with translated(), self.conn.transaction():
            self.conn.execute(QUERIES["function_run_finish"], {
                "run_id": run_id, "status": status, "counts": json.dumps(counts),
                "error": error})
            self.conn.execute(QUERIES["function_totals_add"], {
                "function": function, "totals": json.dumps(totals)})
            self.conn.execute(QUERIES["function_status_set"], {
                "function": function, "status": status, "trigger": trigger,
                "duration": duration_seconds})

    def function_status(self, function: str | None = None) -> list[dict[str, Any]]:
        with translated():
            return self.conn.execute(QUERIES["function_status_get"],
                                     {"function": function}).fetchall()

    def function_totals(self, function: str | None = None) -> list[dict[str, Any]]:
        with translated():
            return self.conn.execute(QUERIES["function_totals_get"],
                                     {"function": function}).fetchall()

    def queue_gauges(self) -> dict[str, Any]:
        with translated():
            row = self.conn.execute(QUERIES["queue_gauges"]).fetchone()
        assert row is not None
        return row

    # -- the cluster compared with the claims (reconciliation, orphan-cleanup) ------------

    def now(self, override: datetime | None = None) -> datetime:
        """The database's clock (or ``override``, a test's injected time)."""
        with translated():
            row = self.conn.execute(QUERIES["clock_now"], {"now": override}).fetchone()
        assert row is not None
        now: datetime = row["now"]
        return now

    def snapshot_begin(self, now: datetime | None = None) -> datetime:
        """Start a pass's snapshot of the worker pods (a table local to this session);
        the time the listing begins, by the database's clock unless ``now`` is given."""
        with translated():
            self.conn.execute(QUERIES["cluster_snapshot_create"])
            self.conn.execute(QUERIES["cluster_snapshot_clear"])
        return self.now(now)

    def snapshot_add(self, pods: Sequence[dict[str, Any]]) -> None:
        """Add one listed page of pods (``Pod.row()``) to the snapshot."""
        if pods:
            with translated():
                self.conn.execute(QUERIES["cluster_snapshot_add"], {"pods": json.dumps(pods)})

    def reclaim_dead_claims(self, *, claimer_pattern: str, listed_at: datetime,
                            grace_seconds: float, retry: RetryPolicy,
                            batch_size: int) -> list[tuple[Transition, bool]]:
        """One bounded batch of live claims whose pod is gone or dead in the snapshot:
        fence rotated, retried or failed. Each transition with whether the pod was missing
        (else it was there, finished or Unknown)."""
        with translated():
            rows = self.conn.execute(QUERIES["claims_dead_reclaim"], {
                "claimer_pattern": claimer_pattern, "listed_at": listed_at,
                "grace_seconds": grace_seconds, "batch_size": batch_size,
                **retry.params()}).fetchall()
        done = [(Transition(r["job_id"], r["status"], r["parent_id"]), bool(r["missing"]))
                for r in rows]
        self.settle([t for t, _ in done])
        return done

    def unverifiable_claims(self, *, claimer_pattern: str) -> int:
        with translated():
            row = self.conn.execute(QUERIES["claims_unverifiable_count"],
                                    {"claimer_pattern": claimer_pattern}).fetchone()
        return int(row["n"]) if row else 0

    def unclaimed_pods(self, *, listed_at: datetime, grace_seconds: float, after: str,
                       limit: int) -> list[dict[str, Any]]:
        """Running pods of the snapshot, older than the grace period, with no live claim."""
        with translated():
            return self.conn.execute(QUERIES["cluster_pods_unclaimed"], {
                "listed_at": listed_at, "grace_seconds": grace_seconds, "after": after,
                "limit": limit}).fetchall()

    def note_suspects(self, *, pods: Sequence[dict[str, Any]],
                      listed_at: datetime) -> list[dict[str, Any]]:
        """Remember unclaimed pods; each with when it was first seen unclaimed."""
        if not pods:
            return []
        with translated():
            return self.conn.execute(QUERIES["orphan_suspects_note"], {
                "pods": json.dumps(list(pods)), "listed_at": listed_at}).fetchall()

    def forget_suspects(self, *, listed_at: datetime) -> int:
        """Forget suspects this pass did not see unclaimed; how many."""
        with translated():
            return self.conn.execute(QUERIES["orphan_suspects_forget"],
                                     {"listed_at": listed_at}).rowcount

    def confirm_suspect(self, name: str) -> bool:
        """True (and forgotten) if the pod still holds no live claim, right before its
        deletion; False if it claimed work meanwhile."""
        with translated():
            return self.conn.execute(QUERIES["orphan_suspect_confirm"],
                                     {"name": name}).fetchone() is not None

    def finished_pods_beyond_history(self, *, keep: int, after: str,
                                     limit: int) -> list[dict[str, Any]]:
        with translated():
            return self.conn.execute(QUERIES["cluster_pods_finished_beyond_history"], {
                "keep": keep, "after": after, "limit": limit}).fetchall()

    def object_owners(self, pairs: Sequence[tuple[UUID, UUID | None]]
                      ) -> dict[tuple[UUID, UUID | None], str]:
        """Who owns the objects of each (job, attempt): keep, garbage or gone."""
        if not pairs:
            return {}
        payload = [{"job_id": str(j), "attempt_id": str(a) if a else None} for j, a in pairs]
        with translated():
            rows = self.conn.execute(QUERIES["objects_owners"],
                                     {"pairs": json.dumps(payload)}).fetchall()
        return {(r["job_id"], r["attempt_id"]): r["verdict"] for r in rows}

    # -- lifecycle: run timeouts, pending expiry, retention -------------------------------

    def reclaim_timed_out(self, *, retry: RetryPolicy, batch_size: int,
                          now: datetime | None = None) -> list[Transition]:
        """One bounded batch of running jobs past their run deadline: fence rotated, back
        to pending with backoff, or failed "timed out" when attempts are exhausted.

        Does not settle: the caller settles the transitions (and counts what that moved).
        """
        with translated():
            rows = self.conn.execute(QUERIES["lifecycle_timeout_reclaim"], {
                "batch_size": batch_size, "now": now, **retry.params()}).fetchall()
        return _transitions(rows)

    def expire_pending(self, *, batch_size: int,
                       now: datetime | None = None) -> tuple[list[Transition], int]:
        """One bounded batch of waiting/pending jobs past their ``expires_at``: cancelled
        "expired before start". A waiting parent's waiting children are cancelled in the
        same transaction, and only counted (second value): a parent's children may be
        many, and nothing waits on a child.

        Does not settle: the caller settles the transitions.
        """
        with translated(), self.conn.transaction():
            rows = self.conn.execute(QUERIES["lifecycle_expire_pending"], {
                "batch_size": batch_size, "now": now}).fetchall()
            parents = [r["job_id"] for r in rows if r["is_parent"]]
            children = 0
            if parents:
                children = self.conn.execute(QUERIES["children_cancel_expired_parent"],
                                             {"parent_ids": parents}).rowcount
        return _transitions(rows), children

    def retention_due(self, *, with_ttl: bool, after: tuple[datetime, UUID], limit: int,
                      default_retention: timedelta,
                      now: datetime | None = None) -> list[RetentionCandidate]:
        """A page of top-level terminal jobs whose retention ran out, after the cursor
        ``after`` = (due, job_id): those with a ttl past ``retain_until``, or those without
        one that finished more than ``default_retention`` ago."""
        query = QUERIES["retention_ttl_page"] if with_ttl else QUERIES["retention_default_page"]
        with translated():
            rows = self.conn.execute(query, {
                "now": now, "after_due": after[0], "after_id": after[1], "limit": limit,
                "retention_seconds": default_retention.total_seconds()}).fetchall()
        return [RetentionCandidate(**row) for row in rows]

    def retention_children(self, *, parent_id: UUID, after: UUID,
                           limit: int) -> list[tuple[UUID, bool]]:
        """A page of a parent's children in id order: (job_id, has_outputs)."""
        with translated():
            rows = self.conn.execute(QUERIES["retention_children_page"], {
                "parent_id": parent_id, "after": after, "limit": limit}).fetchall()
        return [(r["job_id"], r["has_outputs"]) for r in rows]

    def delete_children(self, *, parent_id: UUID, limit: int) -> int:
        """Delete up to ``limit`` terminal children of a parent (one short transaction);
        how many went."""
        with translated():
            return len(self.conn.execute(QUERIES["retention_children_delete"], {
                "parent_id": parent_id, "limit": limit}).fetchall())

    def delete_jobs(self, *, job_ids: Sequence[UUID]) -> list[UUID]:
        """Delete these top-level terminal jobs (action results, outputs and dependency
        rows cascade) in one statement; a parent that still has children is kept. The ids
        deleted."""
        with translated():
            return [r["job_id"] for r in self.conn.execute(
                QUERIES["retention_jobs_delete"], {"job_ids": list(job_ids)})]

    def delete_old_events(self, *, older_than: timedelta, limit: int,
                          now: datetime | None = None) -> int:
        """Delete up to ``limit`` audit events older than ``older_than``, oldest first."""
        return self._delete_older(QUERIES["events_delete_expired"], older_than, limit, now)

    def delete_old_function_runs(self, *, older_than: timedelta, limit: int,
                                 now: datetime | None = None) -> int:
        """Delete up to ``limit`` function-run records started before ``older_than``."""
        return self._delete_older(QUERIES["function_runs_delete_expired"], older_than, limit,
                                  now)

    def _delete_older(self, query: LiteralString, older_than: timedelta, limit: int,
                      now: datetime | None) -> int:
        with translated():
            return self.conn.execute(query, {
                "now": now, "retention_seconds": older_than.total_seconds(),
                "limit": limit}).rowcount

    # -- settling what waited on finished jobs ---------------------------------------------

    def settle(self, transitions: Sequence[Transition],
               budget: int = SETTLE_BATCH) -> list[Transition]:
        """Resolve jobs waiting on the jobs that just became terminal, transitively, at
        most ``budget`` of them; export-finalize resolves the rest at its next pass.

        Returns every further transition it made. Runs after the commit of the transitions
        it is given, each resolution in its own statement.
        """
        made: list[Transition] = []
        frontier = [t.job_id for t in transitions if t.terminal]
        while frontier and budget > 0:
            with translated():
                dependents = list(dict.fromkeys(r["job_id"] for r in self.conn.execute(
                    QUERIES["dependency_dependents"],
                    {"job_ids": frontier, "limit": budget})))
            budget -= len(dependents)
            resolved = self.resolve_waiting(dependents) if dependents else []
            made.extend(resolved)
            frontier = [t.job_id for t in resolved if t.terminal]
        return made

    def _settle_found(self, done: Sequence[Transition], dependents: Sequence[UUID]) -> None:
        """Settle after a terminal write whose first page of dependents came back with it."""
        if not dependents:
            return
        resolved = self.resolve_waiting(dependents)
        self.settle([t for t in resolved if t.terminal], SETTLE_BATCH - len(dependents))

    def resolve_waiting(self, job_ids: Sequence[UUID]) -> list[Transition]:
        """Resolve these waiting jobs if their dependencies allow (pending, a parent
        running with its children released, or failed naming the dependency), in batches
        of ``RESOLVE_BATCH``, each its own transaction unless the caller's is open."""
        out: list[Transition] = []
        for batch in _chunks(list(job_ids), RESOLVE_BATCH):
            with translated(), self.conn.transaction():
                rows = self.conn.execute(QUERIES["waiting_resolve"],
                                         {"job_ids": list(batch)}).fetchall()
                started = [r["job_id"] for r in rows
                           if r["is_parent"] and r["status"] == "running"]
                failed = [r["job_id"] for r in rows
                          if r["is_parent"] and r["status"] == "failed"]
                children: list[dict[str, Any]] = []
                if started:
                    children += self.conn.execute(QUERIES["children_release"],
                                                  {"parent_ids": started}).fetchall()
                if failed:
                    children += self.conn.execute(QUERIES["children_cancel_with_parent"],
                                                  {"parent_ids": failed}).fetchall()
            out += _transitions([*rows, *children])
        return out

    # -- outputs of an attempt -------------------------------------------------------------

    def register_outputs(self, *, job_id: UUID, attempt_id: UUID,
                         outputs: Sequence[tuple[str, str]]) -> bool:
        """Register (path, url) outputs as uploading, under the fence; False when lost."""
        with translated():
            rows = self.conn.execute(QUERIES["attempt_outputs_register"], {
                "job_id": job_id, "attempt_id": attempt_id,
                "outputs": json.dumps([{"path": p, "url": u} for p, u in outputs])}).fetchall()
        return len(rows) == len(outputs)

    def confirm_outputs(self, *, job_id: UUID, attempt_id: UUID,
                        outputs: Sequence[dict[str, Any]]) -> bool:
        """Mark outputs done (``size_bytes``) or error (``error``), under the fence."""
        with translated():
            rows = self.conn.execute(QUERIES["attempt_outputs_confirm"], {
                "job_id": job_id, "attempt_id": attempt_id,
                "outputs": json.dumps(list(outputs))}).fetchall()
        return len(rows) == len(outputs)

    # -- parents ---------------------------------------------------------------------------

    def parents_ready(self, *, after: UUID, limit: int) -> list[UUID]:
        """Running parents whose children are all terminal, a page at a time."""
        with translated():
            return [r["job_id"] for r in self.conn.execute(
                QUERIES["parents_ready"], {"after": after, "limit": limit})]

    def has_active_children(self, parent_id: UUID) -> bool:
        with translated():
            row = self.conn.execute(QUERIES["parent_has_active_children"],
                                    {"parent_id": parent_id}).fetchone()
        return bool(row and row["active"])

    def children_page(self, *, parent_id: UUID, after: UUID,
                      limit: int) -> list[dict[str, Any]]:
        """A page of children, each with its committed output URLs."""
        with translated():
            return self.conn.execute(QUERIES["parent_children_page"], {
                "parent_id": parent_id, "after": after, "limit": limit}).fetchall()

    def first_errors(self, parent_id: UUID, limit: int = 3) -> list[dict[str, Any]]:
        with translated():
            return self.conn.execute(QUERIES["parent_first_errors"],
                                     {"parent_id": parent_id, "limit": limit}).fetchall()

    def finalize_parent(self, *, job_id: UUID, succeeded: bool, manifest: str | None,
                        reason: str, error: str | None) -> Transition | None:
        """The parent's one terminal write; None if another finalizer won (or a child is
        still active)."""
        with translated():
            row = self.conn.execute(QUERIES["parent_finalize"], {
                "job_id": job_id, "status": "succeeded" if succeeded else "failed",
                "manifest": manifest, "reason": reason, "error": error}).fetchone()
        if row is None:
            return None
        done = _transitions([row])
        self.settle(done)
        return done[0]

    def waiting_page(self, *, after: UUID, limit: int) -> list[UUID]:
        with translated():
            return [r["job_id"] for r in self.conn.execute(
                QUERIES["waiting_page"], {"after": after, "limit": limit})]

    # -- reads -----------------------------------------------------------------------------

    def get(self, job_id: UUID) -> dict[str, Any] | None:
        with translated():
            row: dict[str, Any] | None = self.conn.execute(
                QUERIES["job_get"], {"job_id": job_id}).fetchone()
        return row

    def list_jobs(self, *, status: str | None = None, resource: str | None = None,
             parent_id: UUID | None = None, limit: int = 100) -> list[dict[str, Any]]:
        with translated():
            return self.conn.execute(QUERIES["job_list"], {
                "status": status, "resource": resource, "parent_id": parent_id,
                "limit": limit}).fetchall()

    def action_results(self, job_ids: Sequence[UUID]) -> list[dict[str, Any]]:
        with translated():
            return self.conn.execute(QUERIES["job_action_results"],
                                     {"job_ids": list(job_ids)}).fetchall()

    def children_counts(self, job_id: UUID) -> dict[str, int]:
        with translated():
            rows = self.conn.execute(QUERIES["job_children_counts"], {"job_id": job_id})
            return {r["status"]: r["n"] for r in rows}

    def events(self, job_id: UUID) -> list[dict[str, Any]]:
        with translated():
            return self.conn.execute(QUERIES["job_events"], {"job_id": job_id}).fetchall()
