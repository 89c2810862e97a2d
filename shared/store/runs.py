"""Runs of the periodic functions: each run recorded (trigger, status, counts, duration),
and the totals and last statuses the metrics read — kept apart from the run records, so
that their retention never resets a counter or forgets the last success."""

from __future__ import annotations

import json
import socket
from collections.abc import Collection
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from jobfence import db
from jobfence.store.base import Noun


class FunctionStatus(NamedTuple):
    """A periodic function's last run, and its last success."""

    function: str
    last_run_at: datetime
    last_status: str
    last_trigger: str
    last_duration_seconds: float | None
    last_success_at: datetime | None
    consecutive_failures: int = 0
    """Failed runs since the last success."""
    last_values: dict[str, float] | None = None
    """What the last successful run saw (pods listed, orphan suspects...): current values."""


class FunctionTotal(NamedTuple):
    function: str
    item: str
    total: float


class FunctionRun(NamedTuple):
    """One run of a periodic function, as ``jobfence runs`` shows it."""

    run_id: int
    function: str
    trigger: str
    triggered_by: str | None
    trigger_reason: str | None
    status: str
    host: str | None
    started_at: datetime
    finished_at: datetime | None
    duration_seconds: float | None
    counts: dict[str, Any]
    error: str | None


class Runs(Noun):
    sql_file = "runs.sql"

    def run_started(self, *, function: str, trigger: str, holder: UUID,
                    lease_seconds: float, triggered_by: str | None = None,
                    reason: str | None = None) -> int | None:
        """Take the function's lease for ``holder`` and record the run (status running), in
        one transaction; its run id. When another run holds the lease, record a skipped run
        (it counts in the function's totals) and return None. A run found abandoned (its
        lease ran out while it was running) is recorded as interrupted."""
        with db.transaction(self.conn):
            took = self.lease_take(function=function, holder=holder,
                                   lease_seconds=lease_seconds)
            row = self._one("run_started", {
                "function": function, "trigger": trigger,
                "status": "running" if took else "skipped", "host": socket.gethostname(),
                "triggered_by": triggered_by, "reason": reason})
            assert row is not None
            if took is None:
                self.add_totals(function=function, totals={"run:skipped": 1})
                return None
            run_id = int(row["run_id"])
            self.lease_bind(function=function, holder=holder, run_id=run_id)
            abandoned = took["previous_run_id"]
            if abandoned is not None and self.run_abandoned(abandoned):
                self.add_totals(function=function, totals={"run:interrupted": 1})
        return run_id

    def lease_take(self, *, function: str, holder: UUID,
                   lease_seconds: float) -> dict[str, Any] | None:
        """The function's lease for ``holder`` if it is free or ran out (with the run id of
        a holder whose lease ran out); None while another run holds it."""
        return self._one("lease_take", {"function": function, "holder": holder,
                                        "seconds": lease_seconds})

    def lease_bind(self, *, function: str, holder: UUID, run_id: int) -> None:
        self._execute("lease_bind", {"function": function, "holder": holder,
                                     "run_id": run_id})

    def run_abandoned(self, run_id: int) -> bool:
        """Record a run that stopped without recording its end as interrupted; whether it
        was still running."""
        return self._one("run_abandoned", {"run_id": run_id}) is not None

    def lease_renew(self, *, function: str, holder: UUID, lease_seconds: float) -> bool:
        """Extend the holder's lease; False when it no longer holds it."""
        return self._one("lease_renew", {"function": function, "holder": holder,
                                         "seconds": lease_seconds}) is not None

    def lease_release(self, *, function: str, holder: UUID) -> None:
        """Free the function (a no-op unless ``holder`` still holds it)."""
        self._execute("lease_release", {"function": function, "holder": holder})

    def run_finished(self, *, run_id: int, function: str, trigger: str, status: str,
                     counts: dict[str, Any], duration_seconds: float,
                     error: str | None = None, gauges: Collection[str] = ()) -> None:
        """Close a run (succeeded, failed or interrupted), add its numeric counts to the
        function's totals and its duration to the function's duration histogram, and set
        its last status (the last success survives failed runs), in one transaction. The
        counts named in ``gauges`` are what the run saw at that moment: kept as the
        function's last values (a successful run's), never summed."""
        totals: dict[str, float] = {f"run:{status}": 1}
        numbers = {k: v for k, v in counts.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)}
        totals.update({k: v for k, v in numbers.items() if k not in gauges})
        values = {k: v for k, v in numbers.items() if k in gauges}
        with db.transaction(self.conn):
            self._execute("run_finished", {"run_id": run_id, "status": status,
                                           "counts": json.dumps(counts), "error": error})
            self.add_totals(function=function, totals=totals)
            self.add_duration(function=function, seconds=duration_seconds)
            self.set_status(function=function, status=status, trigger=trigger,
                            duration_seconds=duration_seconds, values=values)

    def add_totals(self, *, function: str, totals: dict[str, float]) -> None:
        self._execute("add_totals", {"function": function, "totals": json.dumps(totals)})

    def add_duration(self, *, function: str, seconds: float) -> None:
        """Count a run's duration in the function's duration histogram (its totals'
        ``duration:<upper bound>`` items, and ``duration:sum``)."""
        self._execute("add_duration", {"function": function, "seconds": seconds})

    def set_status(self, *, function: str, status: str, trigger: str,
                   duration_seconds: float, values: dict[str, float] | None = None) -> None:
        self._execute("set_status", {"function": function, "status": status,
                                     "trigger": trigger, "duration": duration_seconds,
                                     "values": json.dumps(values or {})})

    def function_status(self, function: str | None = None) -> list[FunctionStatus]:
        """Every function's last run (or one function's)."""
        return self._rows("function_status", {"function": function}, FunctionStatus)

    def recent(self, *, function: str | None = None, status: str | None = None,
               limit: int = 20) -> list[FunctionRun]:
        """The latest runs, newest first."""
        return self._rows("recent", {"function": function, "status": status,
                                     "limit": limit}, FunctionRun)

    def function_totals(self, function: str | None = None) -> list[FunctionTotal]:
        """Every function's totals (or one function's)."""
        return self._rows("function_totals", {"function": function}, FunctionTotal)

    def latest_run_id(self) -> int:
        """The newest run's id, of any function (0 when there is none): every run that
        begins later has a larger one."""
        row = self._one("latest_run_id")
        return int(row["run_id"]) if row else 0

    def runs_after(self, *, function: str, after: int, limit: int = 100) -> list[FunctionRun]:
        """The function's runs begun after run ``after``, ended or not, oldest first."""
        return self._rows("runs_after", {"function": function, "after": after,
                                         "limit": limit}, FunctionRun)
