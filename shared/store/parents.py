"""Datum parents: the ones whose children are all terminal, and each parent's finalization —
a summary, its children a page at a time (for its manifest), its first errors and its one
terminal write; however many finalizers race, the database lets one of them make the parent
terminal.

A parent is reached by its id (the periodic functions, as the maintainer role) or, by the
worker, through the child its attempt just made terminal (``of_attempt``: the worker role
reads nothing else of other jobs)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from jobfence.store.dependencies import Settling
from jobfence.store.types import (
    ChildEntry,
    ChildError,
    ParentSummary,
    Transition,
    transitions,
)


class Parents(Settling):
    sql_file = "parents.sql"

    def ready(self, *, after: UUID, limit: int) -> list[UUID]:
        """Running parents whose children are all terminal, a page at a time."""
        return [r["job_id"] for r in self._all("ready", {"after": after, "limit": limit})]

    def of(self, parent_id: UUID) -> Parent:
        """A parent by its id."""
        return Parent(self, {"parent_id": parent_id}, by_attempt=False)

    def of_attempt(self, child_id: UUID, attempt_id: UUID) -> Parent:
        """The parent of ``child_id``, for the attempt that made that child terminal."""
        return Parent(self, {"child_id": child_id, "attempt_id": attempt_id}, by_attempt=True)

    # Each statement twice: by the parent's id, and through the child an attempt ended.

    def summary(self, key: dict[str, Any]) -> ParentSummary | None:
        return self._row("summary", key, ParentSummary)

    def attempt_summary(self, key: dict[str, Any]) -> ParentSummary | None:
        return self._row("attempt_summary", key, ParentSummary)

    def children_page(self, *, parent_id: UUID, after: UUID, limit: int) -> list[ChildEntry]:
        """A page of children, each with its committed output URLs."""
        return self._rows("children_page", {"parent_id": parent_id, "after": after,
                                            "limit": limit}, ChildEntry)

    def attempt_children_page(self, key: dict[str, Any]) -> list[ChildEntry]:
        return self._rows("attempt_children_page", key, ChildEntry)

    def first_errors(self, key: dict[str, Any]) -> list[ChildError]:
        return self._rows("first_errors", key, ChildError)

    def attempt_first_errors(self, key: dict[str, Any]) -> list[ChildError]:
        return self._rows("attempt_first_errors", key, ChildError)

    def finalize(self, key: dict[str, Any]) -> Transition | None:
        return self._finalized(self._one("finalize", key))

    def attempt_finalize(self, key: dict[str, Any]) -> Transition | None:
        return self._finalized(self._one("attempt_finalize", key))

    def reopen(self, *, parent_id: UUID, reason: str) -> list[Transition]:
        """A failed or cancelled parent open again, its failed and cancelled children run
        again (a workflow's retry of its fan-out step), in the caller's transaction; the
        jobs moved ([] when the parent had not failed nor been cancelled)."""
        return transitions(self._all("reopen", {"parent_id": parent_id, "reason": reason}))

    def _finalized(self, row: dict[str, Any] | None) -> Transition | None:
        return None if row is None else self._settle(transitions([row])).done[0]


class Parent:
    """One parent's finalization: what it reads, and its one terminal write."""

    def __init__(self, parents: Parents, key: dict[str, Any], *, by_attempt: bool) -> None:
        self._key, self._by_attempt = key, by_attempt
        self._parents = parents

    def summary(self) -> ParentSummary | None:
        """None when there is no such parent (or, reached through a child, the attempt did
        not make that child terminal, or a child is still active)."""
        p = self._parents
        return (p.attempt_summary if self._by_attempt else p.summary)(self._key)

    def children_page(self, *, after: UUID, limit: int) -> list[ChildEntry]:
        key = {**self._key, "after": after, "limit": limit}
        if self._by_attempt:
            return self._parents.attempt_children_page(key)
        return self._parents.children_page(**key)

    def first_errors(self, limit: int = 3) -> list[ChildError]:
        p = self._parents
        return (p.attempt_first_errors if self._by_attempt else p.first_errors)(
            {**self._key, "limit": limit})

    def finalize(self, *, succeeded: bool, manifest: str | None, reason: str,
                 error: str | None) -> Transition | None:
        """The parent's one terminal write, and what waited on it settled; None if another
        finalizer won (or a child is still active)."""
        p = self._parents
        return (p.attempt_finalize if self._by_attempt else p.finalize)({
            **self._key, "status": "succeeded" if succeeded else "failed",
            "manifest": manifest, "reason": reason, "error": error})
