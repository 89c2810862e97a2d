"""Action metrics: runs by outcome, run time, CPU seconds and peak memory, by queue and
action. A trigger on the action results appends what each stored outcome adds (migration
0029) — so a fenced-out write observes nothing — and ``fold`` moves it into totals that
only grow, like the job metrics (``jobfence.store.job_metrics``). An action's label is its
name only when a worker registered that name (``register``, from its registry); any other
counts as ``other``, so a job's action names can never grow the series without bound."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from jobfence.store.base import Noun

OTHER = "other"
"""The label of every action name no worker registered."""


class ActionMetric(NamedTuple):
    """One total of the action metrics."""

    queue: str
    action: str
    """A registered action's name, or ``other``."""
    name: str
    """runs; a histogram (run, cpu, memory) or its sum (run_sum, ...)."""
    label: str
    """runs: the outcome (succeeded, failed); '' otherwise."""
    le: float
    """A histogram bucket's upper bound (stored per bucket, not cumulative); +Inf else."""
    value: float


class ActionMetrics(Noun):
    sql_file = "action_metrics.sql"

    def register(self, names: Iterable[str]) -> int:
        """Know these action names (a worker's registry) as labels of their own; how many
        were new."""
        row = self._one("register", {"names": sorted(set(names))})
        return int(row["added"]) if row else 0

    def fold(self) -> int:
        """Fold every committed delta into the totals; how many were folded."""
        row = self._one("fold")
        return int(row["folded"]) if row else 0

    def totals(self) -> list[ActionMetric]:
        return self._rows("totals", None, ActionMetric)

    def buckets(self) -> dict[str, list[float]]:
        """The upper bounds of the action histograms' buckets (``action``: run time,
        ``cpu``, ``memory``), +Inf last."""
        row = self._one("buckets") or {}
        return {kind: [float(b) for b in row.get(kind) or []]
                for kind in ("action", "cpu", "memory")}
