"""Jobs: inserting them (all or nothing, a parent's children with them), reading them, and
cancelling them (fences rotated)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from jobfence import db
from jobfence.errors import IdempotencyConflict, InvalidSpec, JobNotFound
from jobfence.store.control import Control
from jobfence.store.dependencies import Dependencies, Settling
from jobfence.store.types import (
    TERMINAL,
    ActionResult,
    ChildBatches,
    Enqueued,
    JobEvent,
    JobRow,
    Moved,
    NewJob,
    Transition,
    transitions,
)


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


class Enqueuing:
    """The batches of one enqueue, each added in its transaction (``Jobs.enqueuing``)."""

    def __init__(self, jobs: Jobs, owned: bool) -> None:
        self.jobs = jobs
        self.owned = owned
        """Whether the transaction is the enqueue's own (not the caller's): then its new
        waiting jobs are looked at again after its commit (``Jobs.settled_late``)."""

    def add(self, batch: Sequence[NewJob], children: ChildBatches | None = None,
            rows: str | None = None) -> list[Enqueued]:
        """Insert a batch of jobs (``rows``: their JSON, when made ahead), their
        dependencies and a parent's children. A repeated
        idempotency key returns the existing job when the spec is the same and raises
        ``IdempotencyConflict`` when it is not; ``ResourceBusy`` when a resource is held by
        an active job (the unique index decides, race-free); an ``after`` id that does not
        exist (nor is in the batch) raises ``JobNotFound``. A job whose dependencies have
        all finished already is resolved here."""
        jobs, deps = self.jobs, self.jobs.dependencies
        here = {job.job_id for job in batch}  # a workflow's steps are after each other
        after = sorted({d for job in batch for d in job.after if d not in here}, key=str)
        finished = False
        if after:
            found = deps.status(after)
            missing = [d for d in after if d not in found]
            if missing:
                raise JobNotFound(missing[0])
            finished = any(status in TERMINAL for status in found.values())
        inserted = jobs.insert_many(batch, rows)
        answers = jobs.idempotent_replays(batch, inserted)
        if children is not None:
            answers = [jobs.insert_children(a, j, children)
                       if a.created and j.is_parent and "url" in j.inputs
                       else a for a, j in zip(answers, batch, strict=True)]
        deps.insert_many([(j.job_id, d) for j in batch if j.job_id in inserted
                          for d in j.after])
        waiting = [j.job_id for j in batch if j.job_id in inserted and j.after]
        if waiting and finished:  # some dependency had finished already
            settled = {t.job_id: t.status for t in deps.resolve(waiting)}
            answers = [Enqueued(a.job_id, settled.get(a.job_id, a.status), a.created,
                                a.children) for a in answers]
        return answers


class Jobs(Settling):
    sql_file = "jobs.sql"

    def __init__(self, conn: db.Connection, schema: str, dependencies: Dependencies,
                 control: Control) -> None:
        super().__init__(conn, schema, dependencies)
        self.control = control  # an enqueue takes the drain lock

    # -- enqueue ---------------------------------------------------------------------------

    @contextmanager
    def enqueuing(self) -> Iterator[Enqueuing]:
        """One enqueue's transaction, the drain lock taken: every batch ``add``ed to it is
        written all or nothing (refused while draining: ``Drained``). Inside a transaction
        the caller owns, a savepoint of it, made visible by the caller's commit."""
        owned = not db.in_transaction(self.conn)
        with db.transaction(self.conn):
            self.control.drain_lock()
            yield Enqueuing(self, owned)

    def enqueue(self, jobs: Sequence[NewJob],
                children: ChildBatches | None = None) -> list[Enqueued]:
        """Insert jobs in one transaction, all or nothing (``enqueuing``, one batch); a
        parent's children are made by ``children`` and inserted batch by batch in the same
        transaction (memory stays bounded however many there are)."""
        with self.enqueuing() as adding:
            answers = adding.add(jobs, children)
        return self.settled_late(answers) if adding.owned else answers

    def settled_late(self, answers: Sequence[Enqueued]) -> list[Enqueued]:
        """After the commit of an enqueue of its own: its new jobs still waiting resolved
        if their dependencies allow. A dependency that finished while the enqueue ran could
        not see them as its dependents; after the commit, nothing is missed."""
        still = [a.job_id for a in answers if a.created and a.status == "waiting"]
        if not still:
            return list(answers)
        settled = {t.job_id: t.status for t in self.dependencies.resolve(still)}
        return [Enqueued(a.job_id, settled.get(a.job_id, a.status), a.created, a.children)
                for a in answers]

    def insert_many(self, jobs: Sequence[NewJob], rows: str | None = None) -> set[UUID]:
        """Insert a batch of new jobs (``rows``: their rows' JSON, made ahead by the caller,
        else here); the ids inserted (a repeated idempotency key inserts nothing for its
        job). ``InvalidSpec`` when a job would expire before it may start by the database's
        clock — its ``expires_in`` counts from the transaction's start, which may be long
        before the spec was checked — and the caller's transaction (or savepoint) then
        writes nothing."""
        if rows is None:
            rows = json.dumps([job.row() for job in jobs])
        [answer] = self._all("insert_many", {"jobs": rows})
        if not answer["expires_late"]:
            raise InvalidSpec("a job would expire before it may start: its expires_in, "
                              "counted from the start of this transaction by the database's "
                              "clock, ends before its run_at or delay")
        keyed = set(answer["keyed"])
        return {j.job_id for j in jobs if j.idempotency_key is None or j.job_id in keyed}

    def by_idempotency_keys(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {r["idempotency_key"]: r for r in self._all("by_idempotency_keys",
                                                            {"keys": list(keys)})}

    def insert_children(self, parent: Enqueued, job: NewJob,
                         children: ChildBatches) -> Enqueued:
        count = 0
        for batch in children(job):
            self.insert_many(batch)
            count += len(batch)
        if count == 0:
            raise InvalidSpec(f"job {job.job_id}: its inputs matched no objects")
        return Enqueued(parent.job_id, parent.status, parent.created, count)

    def idempotent_replays(self, jobs: Sequence[NewJob], inserted: set[UUID]) -> list[Enqueued]:
        replayed = [j.idempotency_key for j in jobs if j.job_id not in inserted]
        existing = self.by_idempotency_keys([k for k in replayed if k]) if replayed else {}
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

    # -- cancel ----------------------------------------------------------------------------

    def cancel(self, *, job_id: UUID, reason: str = "cancelled") -> list[Transition]:
        """Cancel a job (and a parent's unfinished children); rotates every fence involved.
        A running attempt stays "stopping" — its job keeps its resource and is not run
        again — until its worker confirms its command is gone, or its lease runs out; the
        worker is told at once (invariant 12).

        ``JobNotFound`` if there is no such job, ``JobAlreadyTerminal`` if it has finished.
        """
        with db.transaction(self.conn):
            done = transitions(self._all("cancel", {"job_id": job_id, "reason": reason}))
        return self._settle(done).done

    # -- reads -----------------------------------------------------------------------------

    def get(self, job_id: UUID) -> JobRow | None:
        return self._row("get", {"job_id": job_id}, JobRow)

    def page(self, *, status: str | None = None, resource: str | None = None,
             parent_id: UUID | None = None, queue: str | None = None,
             labels: Mapping[str, str] | None = None,
             limit: int = 100, after: UUID | None = None) -> list[JobRow]:
        """Jobs newest first, optionally by status, resource, parent, queue or labels
        (jobs carrying all of them); ``after`` a job id, only older ones (the next page)."""
        return self._rows("page", {"status": status, "resource": resource,
                                   "parent_id": parent_id, "queue": queue,
                                   "labels": json.dumps(dict(labels)) if labels else None,
                                   "limit": limit, "after": after}, JobRow)

    def retry(self, *, job_id: UUID, reason: str) -> Transition:
        """Run a failed or cancelled job again with a new attempt budget (audited).
        ``JobNotFound``; ``NotRetryable`` when it is not failed or cancelled, is a parent
        (retry its children), is a child of a parent that is no longer running, or its
        cancelled attempt is still stopping; ``ResourceBusy`` when another active job holds
        its resource; ``Drained`` while draining.

        A job with ``after`` dependencies waits for them as an enqueue makes it wait:
        settled after the retry's commit (``settle_retried``), it is pending when they all
        succeeded, failed when one failed, was cancelled or is gone, else still waiting."""
        with db.transaction(self.conn):
            row = self._one("retry", {"job_id": job_id, "reason": reason})
        assert row is not None, "operator_retry returns its row or raises"
        t = transitions([row])[0]
        if t.status == "waiting":
            settled = {m.job_id: m for m in self.settle_retried([job_id]).done}
            t = settled.get(job_id, t)
        return t

    def settle_retried(self, job_ids: Sequence[UUID]) -> Moved:
        """Settle retried jobs that wait on dependencies, after the retry's commit (a
        dependency that finished meanwhile could not see them waiting: its own look for
        dependents ran before), and what waited on those it failed."""
        return self.dependencies.release(job_ids) if job_ids else Moved([], [])

    def action_results(self, job_ids: Sequence[UUID]) -> list[ActionResult]:
        return self._rows("action_results", {"job_ids": list(job_ids)}, ActionResult)

    def logged_actions(self, job_id: UUID, attempt_id: UUID) -> list[int]:
        """The actions of an attempt whose whole output is on S3 (``jobfence.joblogs``)."""
        return [r["action_index"] for r in self._all(
            "logged_actions", {"job_id": job_id, "attempt_id": attempt_id})]

    def children_counts(self, job_id: UUID) -> dict[str, int]:
        return {r["status"]: r["n"] for r in self._all("children_counts", {"job_id": job_id})}

    def watch(self, job_id: UUID) -> str:
        """Register a waiter on a job; the channel to LISTEN on for its end (a notification
        carries the job id)."""
        self._execute("watch", {"job_id": job_id})
        return f"{self.schema}.finished"

    def unwatch(self, job_id: UUID) -> None:
        self._execute("unwatch", {"job_id": job_id})

    def events(self, job_id: UUID) -> list[JobEvent]:
        """The audit trail of one job, oldest first."""
        return self._rows("events", {"job_id": job_id}, JobEvent)

    # -- a selection, in bulk (jobfence.bulk pages through it) ----------------------------

    def select_page(self, *, status: str, filters: Mapping[str, Any], ceiling: datetime,
                    after: UUID | None, limit: int) -> list[Selected]:
        """A page of the jobs of ``status`` that ``filters`` select (queue, resource,
        parent_id, labels, created_before, created_after), newest first, made no later than
        ``ceiling``, after the job ``after``."""
        return self._rows("select_page", {**_filter_params(filters), "status": status,
                                          "ceiling": ceiling, "after": after,
                                          "limit": limit}, Selected)

    def select_count(self, *, status: str, filters: Mapping[str, Any], ceiling: datetime,
                     cap: int) -> int:
        row = self._one("select_count", {**_filter_params(filters), "status": status,
                                         "ceiling": ceiling, "cap": cap})
        return int(row["n"]) if row else 0

    def clock(self) -> datetime:
        """The database's clock."""
        row = self._one("clock")
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]

    def statuses_of(self, job_ids: Sequence[UUID]) -> list[Selected]:
        return self._rows("statuses_of", {"job_ids": list(job_ids)}, Selected)

    def retry_many(self, *, job_ids: Sequence[UUID], reason: str) -> list[Acted]:
        """Retry up to 1,000 jobs in one transaction, each with ``retry``'s rules; a
        refusal per job (``not_found``, ``not_failed_or_cancelled``, ``parent``,
        ``stopping``, ``parent_not_running``, ``resource_busy``). ``Drained`` while
        draining. A job with dependencies is left ``waiting``: the caller settles those
        (``settle_retried``) once its whole selection is retried, so that a dependency
        retried in a later batch is waited for."""
        with db.transaction(self.conn):
            return self._rows("retry_many", {"job_ids": list(job_ids), "reason": reason},
                              Acted)

    def cancel_many(self, *, job_ids: Sequence[UUID], reason: str
                    ) -> tuple[list[Transition], list[Acted]]:
        """Cancel up to 1,000 jobs (and their parents' unfinished children) in one
        transaction; then settle what waited on them. (what moved, what was refused:
        ``not_found``, ``finished``)."""
        with db.transaction(self.conn):
            rows = self._all("cancel_many", {"job_ids": list(job_ids), "reason": reason})
        done = transitions([r for r in rows if r["refusal"] is None])
        refused = [Acted(r["job_id"], r["status"], r["refusal"]) for r in rows
                   if r["refusal"] is not None]
        return self._settle(done).done, refused

    def reveal_env(self, *, job_id: UUID, actor: str, reason: str) -> list[dict[str, Any]]:
        """Each action's env values (``index``, ``name``, ``env``), recorded with who asked
        and why (``control_events``). ``JobNotFound``."""
        with db.transaction(self.conn):
            row = self._one("reveal_env", {"job_id": job_id, "actor": actor,
                                           "reason": reason})
        return list(row["env"]) if row else []


def _filter_params(filters: Mapping[str, Any]) -> dict[str, Any]:
    labels = filters.get("labels")
    return {"queue": filters.get("queue"), "resource": filters.get("resource"),
            "parent_id": filters.get("parent_id"),
            "labels": json.dumps(dict(labels)) if labels else None,
            "created_before": filters.get("created_before"),
            "created_after": filters.get("created_after")}
