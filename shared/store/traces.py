"""Traces: what a worker that traces reads of its attempt's trace context, apart from its
claim (the claim stays the same whether tracing is on or off)."""

from __future__ import annotations

from typing import NamedTuple
from uuid import UUID

from jobfence.store.base import Noun


class AttemptTrace(NamedTuple):
    traceparent: str | None
    """The job's W3C traceparent, as stored at enqueue; None when it was enqueued without."""
    first_span_id: int | None
    """The span id of the job's first attempt's span (this attempt's, on a first attempt)."""


class Traces(Noun):
    sql_file = "traces.sql"

    def for_attempt(self, job_id: UUID, attempt_id: UUID) -> AttemptTrace | None:
        """The attempt's trace context; None unless ``attempt_id`` holds the job's fence."""
        row = self._one("for_attempt", {"job_id": job_id, "attempt_id": attempt_id})
        if row is None:
            return None
        first = row["first_span_id"]
        return AttemptTrace(row["traceparent"], int(first, 16) if first else None)
