"""The queue at a glance: the count the KEDA trigger reads, and the gauges."""

from __future__ import annotations

from jobfence.store.base import Noun
from jobfence.store.types import QueueGauges


class Queues(Noun):
    sql_file = "queues.sql"

    def scaler_value(self) -> int:
        """What the KEDA trigger sees: ready work plus live claims, 0 while draining."""
        row = self._one("scaler_value")
        return int(row["value"]) if row else 0

    def gauges(self) -> QueueGauges:
        gauges = self._row("gauges", None, QueueGauges)
        assert gauges is not None
        return gauges
