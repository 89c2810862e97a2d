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

from jobfence.store.base import Noun
from jobfence.store.types import (
    ChildEntry,
    ChildError,
    ParentSummary,
    Transition,
    transitions,
)


class Parents(Noun):
    sql_file = "parents.sql"

    def ready(self, *, after: UUID, limit: int) -> list[UUID]:
        """Running parents whose children are all terminal, a page at a time."""
        return [r["job_id"] for r in self._all("ready", {"after": after, "limit": limit})]

    def of(self, parent_id: UUID) -> Parent:
        """A parent by its id."""
        return Parent(self, "", {"parent_id": parent_id})

    def of_attempt(self, child_id: UUID, attempt_id: UUID) -> Parent:
        """The parent of ``child_id``, for the attempt that made that child terminal."""
        return Parent(self, "attempt_", {"child_id": child_id, "attempt_id": attempt_id})

    def children_page(self, *, parent_id: UUID, after: UUID, limit: int) -> list[ChildEntry]:
        """A page of children, each with its committed output URLs."""
        return self.of(parent_id).children_page(after=after, limit=limit)


class Parent:
    """One parent's finalization: what it reads, and its one terminal write."""

    def __init__(self, parents: Parents, prefix: str, key: dict[str, Any]) -> None:
        self._parents, self._prefix, self._key = parents, prefix, key

    def summary(self) -> ParentSummary | None:
        """None when there is no such parent (or, reached through a child, the attempt did
        not make that child terminal)."""
        return self._parents._row(f"{self._prefix}summary", self._key, ParentSummary)

    def children_page(self, *, after: UUID, limit: int) -> list[ChildEntry]:
        return self._parents._rows(f"{self._prefix}children_page",
                                   {**self._key, "after": after, "limit": limit}, ChildEntry)

    def first_errors(self, limit: int = 3) -> list[ChildError]:
        return self._parents._rows(f"{self._prefix}first_errors",
                                   {**self._key, "limit": limit}, ChildError)

    def finalize(self, *, succeeded: bool, manifest: str | None, reason: str,
                 error: str | None) -> Transition | None:
        """The parent's one terminal write, and what waited on it settled; None if another
        finalizer won (or a child is still active)."""
        row = self._parents._one(f"{self._prefix}finalize", {
            **self._key, "status": "succeeded" if succeeded else "failed",
            "manifest": manifest, "reason": reason, "error": error})
        if row is None:
            return None
        return self._parents._settle(transitions([row])).done[0]
