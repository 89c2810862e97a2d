"""Queues: each kind of work in its own queue, served by its own pool of worker pods. The
count each pool's KEDA trigger reads, each queue's state, and a queue's settings: paused (it still
accepts enqueues, claims nothing, its trigger reads 0; running jobs finish), a limit on
its running jobs across every pod, a rate (at most N starts in any window of a period), a
limit on each group's (tenant's) running jobs and claims round-robin across groups, all
enforced by the claim (``worker_claim``)."""

from __future__ import annotations

from functools import cache
from typing import LiteralString

from jobfence import db
from jobfence.store.base import Noun
from jobfence.store.types import GroupStatus, QueueStatus


@cache
def scaler_query(schema: str, queue: str) -> LiteralString:
    """The KEDA trigger query of ``queue``'s pool in ``schema``, as text (no parameters:
    KEDA runs it as it is)."""
    template = db.queries("jobfence.store", "queues.sql", schema)["scaler_value"]
    return db.literal_fill(template, queue=queue)


class Queues(Noun):
    sql_file = "queues.sql"

    def scaler_value(self, queue: str = "default") -> int:
        """What ``queue``'s KEDA trigger reads: ready work plus live claims, capped at the
        queue's limit; 0 while draining or paused (the ``scaler_value`` statement)."""
        row = db.execute(self.conn, scaler_query(self.schema, queue)).fetchone()
        return int(row["value"]) if row else 0

    def pending_total(self) -> int:
        """Ready work plus live claims of every queue, 0 while draining."""
        row = self._one("pending_total")
        return int(row["value"]) if row else 0

    def status(self, queue: str | None = None) -> list[QueueStatus]:
        """Every queue that has active jobs or settings, and ``default`` (or only
        ``queue``, if it is one of those)."""
        return self._rows("status", {"queue": queue}, QueueStatus)

    def configure(self, queue: str, *, paused: bool | None = None,
                  limit: int | None = None, set_limit: bool = False,
                  reason: str | None = None, actor: str | None = None) -> None:
        """Pause or resume ``queue``, or set (``set_limit``; None: no limit) its limit;
        recorded with ``actor`` (who asked) in ``control_events``."""
        self._execute("configure", {"queue": queue, "paused": paused, "max_running": limit,
                                    "set_limit": set_limit, "reason": reason,
                                    "actor": actor})

    def rate(self, queue: str, rate_limit: int | None, period_seconds: float | None, *,
             actor: str | None = None) -> None:
        """Set ``queue``'s rate (None, None: remove it), recorded with ``actor``."""
        self._execute("rate", {"queue": queue, "rate_limit": rate_limit,
                               "period_seconds": period_seconds, "actor": actor})

    def groups(self, queue: str, limit: int = 1000) -> list[GroupStatus]:
        """``queue``'s groups that have active jobs, the most active first."""
        return self._rows("groups", {"queue": queue, "limit": limit}, GroupStatus)

    def set_groups(self, queue: str, *, group_limit: int | None = None,
                   set_group_limit: bool = False, fair: bool | None = None,
                   actor: str | None = None) -> None:
        """Set (``set_group_limit``; None: none) the limit on each of ``queue``'s groups'
        running jobs, or turn its round-robin across groups on or off (``fair``); recorded
        with ``actor``."""
        self._execute("set_groups", {"queue": queue, "set_group_limit": set_group_limit,
                                     "group_limit": group_limit, "fair": fair,
                                     "actor": actor})
