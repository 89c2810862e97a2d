"""The cluster compared with the claims (reconciliation, orphan-cleanup): a pass lists the
worker pods into a snapshot page by page, and the comparisons run in the database, so that
the pass holds one page at a time however many pods and jobs there are. Also who owns the
objects under the installation's prefix on S3."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from jobfence.store.dependencies import Settling
from jobfence.store.types import PodRef, RetryPolicy, Suspect, Transition


class Pods(Settling):
    sql_file = "pods.sql"

    def now(self, override: datetime | None = None) -> datetime:
        """The database's clock (or ``override``, a test's injected time)."""
        row = self._one("now", {"now": override})
        assert row is not None
        now: datetime = row["now"]
        return now

    snapshot: UUID | None = None
    """The snapshot this store's pass fills and compares (``snapshot_begin``)."""

    def snapshot_begin(self, snapshot: UUID, now: datetime | None = None) -> datetime:
        """Start a pass's snapshot of the worker pods (rows keyed by ``snapshot``, the
        pass's own id, so that it holds through a transaction pooler); the time the listing
        begins, by the database's clock unless ``now`` is given."""
        self.snapshot = snapshot
        self.snapshot_forget_stale()
        self.snapshot_forget(snapshot)
        return self.now(now)

    def snapshot_end(self) -> None:
        """Delete the pass's snapshot."""
        if self.snapshot is not None:
            self.snapshot_forget(self.snapshot)
            self.snapshot = None

    def snapshot_forget_stale(self) -> None:
        """Delete what killed passes left (snapshots over an hour old)."""
        self._execute("snapshot_forget_stale")

    def snapshot_forget(self, snapshot: UUID) -> None:
        self._execute("snapshot_forget", {"snapshot": snapshot})

    def snapshot_add(self, pods: Sequence[dict[str, Any]]) -> None:
        """Add one listed page of pods (``Pod.row()``) to the snapshot."""
        if pods:
            self._execute("snapshot_add", {"snapshot": self._snapshot(),
                                           "pods": json.dumps(list(pods))})

    def _snapshot(self) -> UUID:
        if self.snapshot is None:
            raise RuntimeError("no snapshot begun: call snapshot_begin first")
        return self.snapshot

    def reclaim_dead_claims(self, *, claimer_pattern: str, listed_at: datetime,
                            grace_seconds: float, retry: RetryPolicy,
                            batch_size: int) -> list[tuple[Transition, bool]]:
        """One bounded batch of live claims whose pod is gone or dead in the snapshot:
        fence rotated, retried or failed. Each transition with whether the pod was missing
        (else it was there, finished or Unknown)."""
        rows = self._all("reclaim_dead_claims", {
            "claimer_pattern": claimer_pattern, "listed_at": listed_at,
            "grace_seconds": grace_seconds, "batch_size": batch_size, **retry.params(),
            "snapshot": self._snapshot()})
        done = [(Transition(r["job_id"], r["status"], r["parent_id"]), bool(r["missing"]))
                for r in rows]
        self._settle([t for t, _ in done])
        return done

    def unverifiable_claims(self, *, claimer_pattern: str) -> int:
        """Live claims by workers the cluster cannot vouch for (run by hand outside it)."""
        row = self._one("unverifiable_claims", {"claimer_pattern": claimer_pattern})
        return int(row["n"]) if row else 0

    def unclaimed_pods(self, *, listed_at: datetime, grace_seconds: float, after: str,
                       limit: int) -> list[PodRef]:
        """Running pods of the snapshot, older than the grace period, with no live claim."""
        return self._rows("unclaimed_pods", {"snapshot": self._snapshot(), "listed_at": listed_at,
                                             "grace_seconds": grace_seconds, "after": after,
                                             "limit": limit}, PodRef)

    def note_suspects(self, *, pods: Sequence[PodRef], listed_at: datetime) -> list[Suspect]:
        """Remember unclaimed pods; each with when it was first seen unclaimed."""
        if not pods:
            return []
        return self._rows("note_suspects", {
            "pods": json.dumps([{"name": p.name, "job_name": p.job_name, "uid": p.uid,
                                 "job_uid": p.job_uid} for p in pods]),
            "listed_at": listed_at}, Suspect)

    def forget_suspects(self, *, listed_at: datetime) -> int:
        """Forget suspects this pass did not see unclaimed; how many."""
        return self._count("forget_suspects", {"listed_at": listed_at})

    def confirm_suspect(self, name: str) -> bool:
        """True (and forgotten) if the pod still holds no live claim, right before its
        deletion; False if it claimed work meanwhile."""
        return self._one("confirm_suspect", {"name": name}) is not None

    def finished_pods_beyond_history(self, *, keep: int, after: str,
                                     limit: int) -> list[PodRef]:
        """Finished worker pods older than the newest ``keep``, holding no live claim."""
        return self._rows("finished_pods_beyond_history", {"snapshot": self._snapshot(),
                                                            "keep": keep, "after": after,
                                                            "limit": limit}, PodRef)

    def object_owners(self, pairs: Sequence[tuple[UUID, UUID | None]]
                      ) -> dict[tuple[UUID, UUID | None], str]:
        """Who owns the objects of each (job, attempt): keep, garbage or gone."""
        if not pairs:
            return {}
        payload = [{"job_id": str(j), "attempt_id": str(a) if a else None} for j, a in pairs]
        return {(r["job_id"], r["attempt_id"]): r["verdict"] for r in self._all(
            "object_owners", {"pairs": json.dumps(payload)})}
