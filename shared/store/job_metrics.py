"""Job metrics: jobs finished by status, attempts ended by outcome, and the wait and run
time histograms, by queue. The audit trigger appends what each transition statement adds
(migration 0015); ``fold`` moves it into the totals, which only ever grow — so the counters
add up across short-lived pods, survive them, and outlive the audit trail's retention."""

from __future__ import annotations

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
