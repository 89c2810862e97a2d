"""`after` dependencies: recording them, and settling what waited once jobs finish.

A job `after` others becomes runnable when they all succeeded, and fails (naming the
dependency) when one failed, was cancelled or is gone. The enqueue and a dependency's
terminal write race; neither locks the other (a running dependency must keep renewing its
lease). Each side reads after its own commit instead — the terminal write asks for its
dependents in the same round trip, after its Sync; an enqueue that owns its transaction
reads its dependencies again after its commit — so whichever commits second sees the
other. An enqueue inside an application's transaction cannot read after that commit;
``export-finalize`` resolves what it leaves waiting at its next pass.

Settling is bounded: a terminal write releases at most ``SETTLE_BATCH`` dependents inline;
export-finalize pages through the rest (``waiting_page``). Each batch is resolved by index
probes per job, so it costs the same however many jobs wait in the table.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from uuid import UUID

from jobfence import db
from jobfence.store.base import Noun
from jobfence.store.types import Moved, Transition, transitions

SETTLE_BATCH = 1000
"""Dependents a verb releases inline after making jobs terminal; export-finalize pages
through the rest."""

RESOLVE_BATCH = 5000
"""Waiting jobs resolved per statement."""


def _chunks(items: Sequence[UUID], size: int) -> Iterator[list[UUID]]:
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


class Dependencies(Noun):
    sql_file = "dependencies.sql"

    def status(self, job_ids: Sequence[UUID]) -> dict[UUID, str]:
        """The status of each of these jobs that exists (a plain read, never a lock)."""
        return {r["job_id"]: r["status"] for r in self._all("status",
                                                             {"job_ids": list(job_ids)})}

    def insert_many(self, pairs: Sequence[tuple[UUID, UUID]]) -> None:
        """Record (job, depends_on) pairs."""
        if pairs:
            self._execute("insert_many", {"deps": json.dumps(
                [{"job_id": str(j), "depends_on": str(d)} for j, d in pairs])})

    def settle_cursor(self, job_ids: Sequence[UUID]) -> db.Cursor:
        """Settle the dependents of jobs one statement made terminal: queued in a pipeline
        after the Sync of that statement, it runs after its commit (its transitions need
        not be read). One settling statement however many jobs."""
        return self._execute("settle", {"job_ids": list(job_ids), "budget": SETTLE_BATCH})

    def settle(self, done: Sequence[Transition], budget: int = SETTLE_BATCH) -> list[Transition]:
        """Resolve jobs waiting on the jobs that just became terminal, transitively, at
        most ``budget`` of them; export-finalize resolves the rest at its next pass.

        Returns every further transition it made. Runs after the commit of the transitions
        it is given, in one statement of its own.
        """
        frontier = [t.job_id for t in done if t.terminal]
        if not frontier or budget <= 0:
            return []
        return transitions(self._all("settle", {"job_ids": frontier, "budget": budget}))

    def resolve(self, job_ids: Sequence[UUID]) -> list[Transition]:
        """Resolve these waiting jobs if their dependencies allow (pending, a parent
        running with its children released, or failed naming the dependency), in batches
        of ``RESOLVE_BATCH``, each its own statement."""
        out: list[Transition] = []
        for batch in _chunks(job_ids, RESOLVE_BATCH):
            out += transitions(self._all("resolve", {"job_ids": batch}))
        return out

    def release(self, job_ids: Sequence[UUID]) -> Moved:
        """``resolve`` these waiting jobs, then settle what waited on those it made
        terminal (export-finalize's safety net)."""
        done = self.resolve(job_ids)
        return Moved(done, self.settle(done))

    def waiting_page(self, *, after: UUID, limit: int) -> list[UUID]:
        """Waiting top-level jobs after ``after`` in id order (the safety net's pages)."""
        return [r["job_id"] for r in self._all("waiting_page", {"after": after,
                                                                 "limit": limit})]


class Settling(Noun):
    """A noun whose verbs make jobs terminal, and so settle what waited on them."""

    def __init__(self, conn: db.Connection, schema: str, dependencies: Dependencies) -> None:
        super().__init__(conn, schema)
        self.dependencies = dependencies

    def _settle(self, done: list[Transition]) -> Moved:
        """The one settle rule of every verb that moves jobs, run by the verb once its
        transaction has committed, never by its caller: what waited on the jobs it made
        terminal is released or failed (``Dependencies.settle``: at most ``SETTLE_BATCH``
        inline, export-finalize pages through the rest)."""
        return Moved(done, self.dependencies.settle(done))
