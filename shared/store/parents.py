"""Datum parents: the ones whose children are all terminal, a parent's children a page at a
time (for its manifest), and its one finalization — however many finalizers race, the
database lets one of them make the parent terminal."""

from __future__ import annotations

from uuid import UUID

from jobfence.store.base import Noun
from jobfence.store.types import ChildEntry, ChildError, Transition, transitions


class Parents(Noun):
    sql_file = "parents.sql"

    def ready(self, *, after: UUID, limit: int) -> list[UUID]:
        """Running parents whose children are all terminal, a page at a time."""
        return [r["job_id"] for r in self._all("ready", {"after": after, "limit": limit})]

    def has_active_children(self, parent_id: UUID) -> bool:
        row = self._one("has_active_children", {"parent_id": parent_id})
        return bool(row and row["active"])

    def children_page(self, *, parent_id: UUID, after: UUID, limit: int) -> list[ChildEntry]:
        """A page of children, each with its committed output URLs."""
        return self._rows("children_page", {"parent_id": parent_id, "after": after,
                                            "limit": limit}, ChildEntry)

    def first_errors(self, parent_id: UUID, limit: int = 3) -> list[ChildError]:
        return self._rows("first_errors", {"parent_id": parent_id, "limit": limit}, ChildError)

    def finalize(self, *, job_id: UUID, succeeded: bool, manifest: str | None,
                 reason: str, error: str | None) -> Transition | None:
        """The parent's one terminal write; None if another finalizer won (or a child is
        still active)."""
        row = self._one("finalize", {
            "job_id": job_id, "status": "succeeded" if succeeded else "failed",
            "manifest": manifest, "reason": reason, "error": error})
        if row is None:
            return None
        return self._settle(transitions([row])).done[0]
