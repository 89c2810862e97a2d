"""Drain mode: quiesce an installation for an upgrade or an incident. While it is on,
enqueue is refused, no claim is made, the KEDA trigger reads 0, and running jobs finish."""

from __future__ import annotations

from jobfence.errors import Drained
from jobfence.store.base import Noun
from jobfence.store.types import DrainState


class Control(Noun):
    sql_file = "control.sql"

    def drain_status(self) -> DrainState:
        state = self._row("drain_status", None, DrainState)
        assert state is not None, "jobfence_control holds one row from migration 0001 on"
        return state

    def drain_lock(self) -> None:
        """Inside an enqueue's transaction: wait for a `drain on` under way, then refuse
        if it is on (``Drained``); holds a share lock so `drain on` waits for this enqueue."""
        row = self._one("drain_lock")
        if row and row["draining"]:
            raise Drained("drain mode is on: enqueue is refused until `drain off`")

    def set_drain(self, *, on: bool, reason: str | None = None) -> DrainState:
        state = self._row("set_drain", {"draining": on, "reason": reason}, DrainState)
        assert state is not None
        return state

    def running_count(self) -> int:
        """Live claims: how many jobs still run (what drain waits for)."""
        row = self._one("running_count")
        return int(row["n"]) if row else 0
