"""Runs of the periodic functions: each run recorded (trigger, status, counts, duration),
and the totals and last statuses the metrics read — kept apart from the run records, so
that their retention never resets a counter or forgets the last success."""

from __future__ import annotations

import json
import socket
from typing import Any

from jobfence import db
from jobfence.store.base import Noun
from jobfence.store.types import FunctionStatus, FunctionTotal


class Runs(Noun):
    sql_file = "runs.sql"

    def run_started(self, *, function: str, trigger: str, skipped: bool = False) -> int:
        """Record a function run (status running, or skipped when another run holds its
        lock); its run id. A skipped run also counts in the function's totals."""
        with db.transaction(self.conn):
            row = self._one("run_started", {
                "function": function, "trigger": trigger,
                "status": "skipped" if skipped else "running", "host": socket.gethostname()})
            if skipped:
                self.add_totals(function=function, totals={"run:skipped": 1})
        assert row is not None
        return int(row["run_id"])

    def run_finished(self, *, run_id: int, function: str, trigger: str, succeeded: bool,
                     counts: dict[str, Any], duration_seconds: float,
                     error: str | None = None) -> None:
        """Close a run, add its numeric counts to the function's totals and set its last
        status (the last success survives failed runs), in one transaction."""
        status = "succeeded" if succeeded else "failed"
        totals: dict[str, float] = {f"run:{status}": 1}
        totals.update({k: v for k, v in counts.items()
                       if isinstance(v, int | float) and not isinstance(v, bool)})
        with db.transaction(self.conn):
            self._execute("run_finished", {"run_id": run_id, "status": status,
                                           "counts": json.dumps(counts), "error": error})
            self.add_totals(function=function, totals=totals)
            self.set_status(function=function, status=status, trigger=trigger,
                            duration_seconds=duration_seconds)

    def add_totals(self, *, function: str, totals: dict[str, float]) -> None:
        self._execute("add_totals", {"function": function, "totals": json.dumps(totals)})

    def set_status(self, *, function: str, status: str, trigger: str,
                   duration_seconds: float) -> None:
        self._execute("set_status", {"function": function, "status": status,
                                     "trigger": trigger, "duration": duration_seconds})

    def function_status(self, function: str | None = None) -> list[FunctionStatus]:
        """Every function's last run (or one function's)."""
        return self._rows("function_status", {"function": function}, FunctionStatus)

    def function_totals(self, function: str | None = None) -> list[FunctionTotal]:
        """Every function's totals (or one function's)."""
        return self._rows("function_totals", {"function": function}, FunctionTotal)

    # -- one run at a time -------------------------------------------------------------------

    def try_lock(self, function: str) -> bool:
        """Take the function's lock if no other run holds it."""
        row = self._one("try_lock", db.lock_params(f"{self.store.schema}:{function}"))
        return bool(row and row["ok"])

    def unlock(self, function: str) -> None:
        self._execute("unlock", db.lock_params(f"{self.store.schema}:{function}"))
