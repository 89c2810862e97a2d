"""The periodic passes over jobs, each verb one bounded batch in one short transaction:
reclaiming expired leases (sweeper), run timeouts and pending expiry, retention of finished
jobs and of the history (lifecycle).

Taking a claim away always goes through one SQL function, ``jobfence_reclaim`` (migration
0005): the fence is rotated, and the job goes back to pending after the retry delay or
fails once its attempts are exhausted.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple
from uuid import UUID

from jobfence import db
from jobfence.store.dependencies import Settling
from jobfence.store.types import Moved, RetryPolicy, Transition, transitions


class RetentionCandidate(NamedTuple):
    """A top-level terminal job whose retention has run out."""

    job_id: UUID
    is_parent: bool
    has_outputs: bool
    """Whether an attempt registered outputs: only then can it own objects on S3 (outputs
    are registered under the fence before they are uploaded)."""
    due: datetime
    """Its place in the retention order (retain_until, or finished_at without a ttl)."""


class Maintenance(Settling):
    sql_file = "maintenance.sql"

    def reclaim_expired(self, *, retry: RetryPolicy, batch_size: int,
                        now: datetime | None = None) -> list[Transition]:
        """One bounded batch of expired leases: fence rotated, back to pending with backoff
        or failed when attempts are exhausted. ``now`` defaults to the database's clock.
        What waited on the jobs that failed is settled."""
        return self._settle(transitions(self._all("reclaim_expired", {
            "batch_size": batch_size, "now": now, **retry.params()}))).done

    def reclaim_timed_out(self, *, retry: RetryPolicy, batch_size: int,
                          now: datetime | None = None) -> Moved:
        """One bounded batch of running jobs past their run deadline: fence rotated, back
        to pending with backoff, or failed "timed out" when attempts are exhausted; how
        late past its deadline each was stopped is recorded with it. What waited on the
        jobs that failed is settled."""
        return self._settle(transitions(self._all("reclaim_timed_out", {
            "batch_size": batch_size, "now": now, **retry.params()})))

    def release_stopped(self, *, batch_size: int) -> list[UUID]:
        """One bounded batch of stopping attempts (a cancel or a timeout rotated their
        fence while their command ran) whose lease has run out without their worker
        confirming the command gone: their jobs' resources are free again, a pending one
        claimable. The lease bounded how long such a command may have run."""
        return [r["job_id"] for r in self._all("release_stopped", {"batch_size": batch_size})]

    def expire_pending(self, *, batch_size: int,
                       now: datetime | None = None) -> tuple[Moved, int]:
        """One bounded batch of waiting/pending jobs never started, past their
        ``expires_at``: cancelled "expired before start" (a job that started once is never
        expired), with how late past its expiry each was. A waiting parent's
        waiting children are cancelled in the same transaction, and only counted (second
        value): a parent's children may be many, and nothing waits on a child. What waited
        on the expired jobs is settled."""
        with db.transaction(self.conn):
            rows = self._all("expire_pending", {"batch_size": batch_size, "now": now})
            parents = [r["job_id"] for r in rows if r["is_parent"]]
            children = self.cancel_children_of_expired(parents)
        return self._settle(transitions(rows)), children

    def cancel_children_of_expired(self, parent_ids: Sequence[UUID]) -> int:
        """Parents that expired while waiting: their waiting children will never run."""
        if not parent_ids:
            return 0
        return self._count("cancel_children_of_expired", {"parent_ids": list(parent_ids)})

    # -- retention -------------------------------------------------------------------------

    def retention_due_with_ttl(self, *, after: tuple[datetime, UUID], limit: int,
                               now: datetime | None = None) -> list[RetentionCandidate]:
        """A page of top-level terminal jobs past their ``retain_until``, after the cursor
        ``after`` = (due, job_id)."""
        return self._rows("retention_due_with_ttl", {
            "now": now, "after_due": after[0], "after_id": after[1], "limit": limit},
            RetentionCandidate)

    def retention_due_without_ttl(self, *, after: tuple[datetime, UUID], limit: int,
                                  default_retention: timedelta,
                                  now: datetime | None = None) -> list[RetentionCandidate]:
        """A page of top-level terminal jobs without a ttl that finished more than
        ``default_retention`` ago, after the cursor ``after``."""
        return self._rows("retention_due_without_ttl", {
            "now": now, "after_due": after[0], "after_id": after[1], "limit": limit,
            "retention_seconds": default_retention.total_seconds()}, RetentionCandidate)

    def retention_children(self, *, parent_id: UUID, after: UUID,
                           limit: int) -> list[tuple[UUID, bool]]:
        """A page of a parent's children in id order: (job_id, has_outputs)."""
        return [(r["job_id"], r["has_outputs"]) for r in self._all(
            "retention_children", {"parent_id": parent_id, "after": after, "limit": limit})]

    def delete_children(self, *, parent_id: UUID, limit: int) -> int:
        """Delete up to ``limit`` terminal children of a parent; how many went."""
        return len(self._all("delete_children", {"parent_id": parent_id, "limit": limit}))

    def delete_jobs(self, *, job_ids: Sequence[UUID], default_retention: timedelta,
                    now: datetime | None = None) -> list[UUID]:
        """Delete these top-level terminal jobs (action results, outputs and dependency
        rows cascade) in one statement; a parent that still has children is kept. The ids
        deleted. How late each went after its retention ended (``retain_until``, or its
        finish plus ``default_retention`` without a ttl) is recorded with them."""
        return [r["job_id"] for r in self._all("delete_jobs", {
            "job_ids": list(job_ids), "now": now,
            "retention_seconds": default_retention.total_seconds()})]

    def delete_old_events(self, *, older_than: timedelta, limit: int,
                          now: datetime | None = None) -> int:
        """Delete up to ``limit`` audit events older than ``older_than``, oldest first."""
        return self._count("delete_old_events", {
            "now": now, "retention_seconds": older_than.total_seconds(), "limit": limit})

    def delete_old_control_events(self, *, older_than: timedelta, limit: int,
                                  now: datetime | None = None) -> int:
        """Delete up to ``limit`` records of operators' changes (queues, drain) older than
        ``older_than``, oldest first."""
        return self._count("delete_old_control_events", {
            "now": now, "retention_seconds": older_than.total_seconds(), "limit": limit})

    def delete_old_function_runs(self, *, older_than: timedelta, limit: int,
                                 now: datetime | None = None) -> int:
        """Delete up to ``limit`` function-run records started before ``older_than``."""
        return self._count("delete_old_function_runs", {
            "now": now, "retention_seconds": older_than.total_seconds(), "limit": limit})

    def delete_old_function_triggers(self, *, older_than: timedelta, limit: int,
                                     now: datetime | None = None) -> int:
        """Delete up to ``limit`` manual-trigger records made before ``older_than``."""
        return self._count("delete_old_function_triggers", {
            "now": now, "retention_seconds": older_than.total_seconds(), "limit": limit})

    def delete_old_workflows(self, *, older_than: timedelta, limit: int,
                             now: datetime | None = None) -> int:
        """Delete up to ``limit`` workflows submitted before ``older_than`` whose steps
        retention has deleted."""
        return self._count("delete_old_workflows", {
            "now": now, "retention_seconds": older_than.total_seconds(), "limit": limit})

    def delete_old_schedule_ticks(self, *, older_than: timedelta, limit: int,
                                  now: datetime | None = None) -> int:
        """Delete up to ``limit`` recorded schedule ticks older than ``older_than``."""
        return self._count("delete_old_schedule_ticks", {
            "now": now, "retention_seconds": older_than.total_seconds(), "limit": limit})
