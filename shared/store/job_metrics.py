"""Job metrics: jobs finished by status, attempts ended by outcome, the wait and run time
histograms, and the lag histograms (how late lifecycle enforced what came due, how late a
parent was finalized after its last child), by queue. The audit trigger appends what each
transition statement adds (migration 0015), lifecycle's statements their lateness (0020), a
worker its guard faults (0037); ``fold`` moves it into the totals, which only ever grow —
so the counters add up across short-lived pods, survive them, and outlive the audit trail's
retention."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from jobfence.store.base import Noun
from jobfence.store.types import JobMetric


class JobMetrics(Noun):
    sql_file = "job_metrics.sql"

    def fold(self) -> int:
        """Fold every committed delta into the totals; how many were folded."""
        row = self._one("fold")
        return int(row["folded"]) if row else 0

    def guard_faults(self, queue: str, counts: Mapping[str, int]) -> None:
        """Add a worker's guard faults (by guard, ``jobfence.worker.faults``) to the
        metrics of its queue."""
        names = sorted(counts)
        self._execute("guard_faults", {"queue": queue, "guards": names,
                                       "counts": [int(counts[n]) for n in names]})

    def totals(self) -> list[JobMetric]:
        return self._rows("totals", None, JobMetric)

    def buckets(self) -> dict[str, list[float]]:
        """The upper bounds of each kind of histogram's buckets (``wait``, ``run``,
        ``pass``, ``lag``), +Inf last."""
        row = self._one("buckets") or {}
        return {kind: [float(b) for b in row.get(kind) or []]
                for kind in ("wait", "run", "pass", "lag")}

    def overdue(self, *, default_retention: timedelta | None = None) -> dict[str, float]:
        """For each kind of deadline lifecycle enforces (``timeout``, ``expiry``,
        ``retention``), how many seconds ago the oldest one not enforced yet came due; 0
        when none has. Jobs without a ttl count for retention only when
        ``default_retention`` is given."""
        seconds = None if default_retention is None else default_retention.total_seconds()
        return {r["kind"]: float(r["seconds"])
                for r in self._all("overdue", {"retention_seconds": seconds})}

    def history(self, *, queue: str, since: datetime) -> list[dict[str, Any]]:
        """A queue's folded minutes since ``since``: finished, wait (claims) and run rows
        (``minute``, ``name``, ``label``, ``le``, ``value``)."""
        return self._all("history", {"queue": queue, "since": since})

    def claims(self, queues: Sequence[str]) -> dict[str, tuple[datetime | None, bool]]:
        """Per queue: the last minute a claim was folded, and whether one ever was."""
        return {r["queue"]: (r["last_claim"], bool(r["ever"]))
                for r in self._all("claims", {"queues": list(queues)})}

    def recent_queues(self) -> list[str]:
        """Queues with anything folded in the last hour."""
        return [r["queue"] for r in self._all("recent_queues")]
