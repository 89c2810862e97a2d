"""Manual triggers of the periodic functions: at most one per function per interval,
decided by the database (whatever the number of console replicas), each recorded with who
asked, why, and what the cluster did with it."""

from __future__ import annotations

from datetime import datetime

from jobfence.errors import RateLimited
from jobfence.store.base import Noun
from jobfence.store.types import FunctionTrigger


class Triggers(Noun):
    sql_file = "triggers.sql"

    def request(self, *, function: str, requested_by: str, reason: str,
                interval: float) -> FunctionTrigger:
        """Take the function's slot and record the request; ``RateLimited`` (with the time
        the slot frees up) when another trigger took it less than ``interval`` seconds ago."""
        found = self._row("request", {"function": function, "requested_by": requested_by,
                                      "reason": reason, "interval": interval},
                          FunctionTrigger)
        if found is None:
            raise RateLimited(f"{function} was triggered less than {interval:g} s ago",
                              retry_at=self.next_allowed(function=function,
                                                         interval=interval))
        return found

    def next_allowed(self, *, function: str, interval: float) -> datetime | None:
        row = self._one("next_allowed", {"function": function, "interval": interval})
        return row["at"] if row else None

    def created(self, *, trigger_id: int, job_name: str) -> FunctionTrigger | None:
        return self._row("created", {"trigger_id": trigger_id, "job_name": job_name},
                         FunctionTrigger)

    def failed(self, *, trigger_id: int, error: str) -> FunctionTrigger | None:
        """Record the cluster's refusal and free the slot (nobody waits for a trigger that
        never ran)."""
        return self._row("failed", {"trigger_id": trigger_id, "error": error[:2000]},
                         FunctionTrigger)

    def recent(self, *, function: str | None = None, limit: int = 20) -> list[FunctionTrigger]:
        return self._rows("recent", {"function": function, "limit": limit}, FunctionTrigger)
