"""Job metrics: jobs finished by status, attempts ended by outcome, and the wait and run
time histograms, by queue. The audit trigger appends what each transition statement adds
(migration 0015); ``fold`` moves it into the totals, which only ever grow — so the counters
add up across short-lived pods, survive them, and outlive the audit trail's retention."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jobfence.store.base import Noun
from jobfence.store.types import JobMetric


class JobMetrics(Noun):
    sql_file = "job_metrics.sql"

    def fold(self) -> int:
        """Fold every committed delta into the totals; how many were folded."""
        row = self._one("fold")
        return int(row["folded"]) if row else 0

    def totals(self) -> list[JobMetric]:
        return self._rows("totals", None, JobMetric)

    def buckets(self) -> dict[str, list[float]]:
        """The upper bounds of the ``wait`` and ``run`` histograms' buckets, +Inf last."""
        row = self._one("buckets") or {}
        return {kind: [float(b) for b in row.get(kind) or []] for kind in ("wait", "run")}

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
