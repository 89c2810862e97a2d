"""The values of the worker's batch verbs (``Attempts.finish_many``): a terminal write of
one attempt among many, and the claim that rides on them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple
from uuid import UUID

from jobfence.limits import MAX_DETAIL_CHARS, storable_text
from jobfence.store.types import NO_OUTCOME, ActionOutcome


class ClaimRequest(NamedTuple):
    """A claim of up to ``limit`` jobs of ``queue`` (alone, or riding on a batch of terminal
    writes), named by ``claim_id`` so that it can be given back when its answer is lost."""

    worker_id: str
    lease_seconds: float
    queue: str
    limit: int
    claim_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class TerminalWrite:
    """One attempt's terminal write in a batch (``finish_many``): succeeded or failed,
    matched on its own fence, with its last action's outcome."""

    job_id: UUID
    attempt_id: UUID
    succeeded: bool
    outcome: ActionOutcome | None = None
    reason: str | None = None
    error: str | None = None
    error_detail: str | None = None

    def params(self) -> dict[str, Any]:
        """The parameters of the single-row terminal write (``finish``): a batch of one
        is sent as that, its values as they are, with no JSON around them."""
        status = "succeeded" if self.succeeded else "failed"
        return {"job_id": self.job_id, "attempt_id": self.attempt_id, "status": status,
                "reason": storable_text(self.reason or status),
                "error": storable_text(self.error),
                "error_detail": storable_text(self.error_detail, MAX_DETAIL_CHARS),
                **(self.outcome.params("action_") if self.outcome else NO_OUTCOME)}

    def row(self) -> dict[str, Any]:
        """This write as one element of ``finish_many``'s JSON array."""
        row = self.params()
        row["job_id"], row["attempt_id"] = str(self.job_id), str(self.attempt_id)
        if row["action_result"] is not None:  # JSON text: nested as the value it holds
            row["action_result"] = json.loads(row["action_result"])
        return row
