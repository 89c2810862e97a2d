"""Workflows: a graph of named steps submitted at once, each step a job (``jobs.workflow_id``,
``jobs.step``). The row of a submission (its name, its key, who submitted it, whether it was
cancelled), its state derived from its steps' jobs, and its cancel and retry marks; the
steps themselves are written and moved by the jobs' own verbs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from jobfence.store.base import Noun


class WorkflowRow(NamedTuple):
    """A workflow and its state (``jobfence_workflow_state``)."""

    workflow_id: UUID
    name: str
    idempotency_key: str | None
    steps: int
    created_by: str | None
    created_at: datetime
    cancelled_at: datetime | None
    status: str
    """running, succeeded, failed (a step failed or was cancelled) or cancelled."""
    failed_step: str | None
    """The first step that failed on its own (not for a dependency)."""
    steps_done: int
    steps_failed: int
    started_at: datetime | None
    finished_at: datetime | None


class StepRow(NamedTuple):
    """One step of a workflow: its job and the steps (and other jobs) it is after."""

    workflow_id: UUID
    step: str
    job_id: UUID
    status: str
    is_parent: bool
    reason: str | None
    error: str | None
    attempt_count: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    inputs_from: list[str]
    inputs_handed: int | None
    after: list[str]
    after_jobs: list[UUID]


class Recent(NamedTuple):
    workflow_id: UUID
    name: str
    status: str
    steps_failed: int
    seconds: float | None
    """Submitted to its last step's end; None while a step is unfinished."""


class Summary(NamedTuple):
    """The workflows of the last day: how many by status, and each name's latest finished."""

    counts: dict[str, int]
    latest: list[Recent]


class Added(NamedTuple):
    workflow_id: UUID
    spec_hash: str
    created: bool
    """False when the key was used already (the first workflow under it, answered)."""


class Workflows(Noun):
    sql_file = "workflows.sql"

    def add(self, *, workflow_id: UUID, name: str, key: str | None, spec_hash: str,
            steps: int, actor: str | None) -> Added:
        """The workflow's row, in the caller's transaction (before its steps); with a key
        already used, nothing written and the first workflow under it answered."""
        row = self._row("add", {"workflow_id": workflow_id, "name": name, "key": key,
                                "spec_hash": spec_hash, "steps": steps, "actor": actor},
                        Added)
        assert row is not None, "operator_workflow_add answers a row"
        return row

    def mark(self, *, workflow_id: UUID, cancelled: bool, actor: str | None,
             reason: str) -> None:
        """Mark the workflow cancelled (or, retried, not), recorded with who and why."""
        self._execute("mark", {"workflow_id": workflow_id, "cancelled": cancelled,
                               "actor": actor, "reason": reason})

    def get(self, workflow_id: UUID) -> WorkflowRow | None:
        return self._row("get", {"workflow_id": workflow_id}, WorkflowRow)

    def page(self, *, name: str | None = None, limit: int = 100,
             after: UUID | None = None) -> list[WorkflowRow]:
        """Workflows newest first, optionally by name; ``after``: only older ones."""
        return self._rows("page", {"name": name, "limit": limit, "after": after},
                          WorkflowRow)

    def steps(self, workflow_ids: Sequence[UUID]) -> dict[UUID, list[StepRow]]:
        """The steps of each of these workflows (one query however many), by workflow."""
        found: dict[UUID, list[StepRow]] = {w: [] for w in workflow_ids}
        for row in self._rows("steps", {"workflow_ids": list(workflow_ids)}, StepRow):
            found[row.workflow_id].append(row)
        return found

    def summary(self) -> Summary:
        """The workflows submitted in the last day: how many by status, and each name's
        latest finished one (what the metrics show)."""
        counts: dict[str, int] = {}
        latest: dict[str, Recent] = {}
        for r in self._rows("summary", None, Recent):  # newest first
            counts[r.status] = counts.get(r.status, 0) + 1
            if r.seconds is not None and r.name not in latest:
                latest[r.name] = r
        return Summary(counts, list(latest.values()))
