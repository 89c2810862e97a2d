"""The queue page's chart and warnings, read from the stored histograms: per minute of the
last hour, jobs finished by status, claims, and the run time's 50th, 95th and 99th
percentiles (interpolated within the histogram's buckets, as Prometheus'
``histogram_quantile`` does); and, per queue, whether ready work waits with no recent
claim (``stalled``) or no worker has ever claimed from it (``never_served``: is there a
pool for it?)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

QUANTILES = (0.5, 0.95, 0.99)
STALLED_AFTER = timedelta(minutes=5)
"""Ready work older than this, and no claim folded for this long: the queue is stalled."""


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a histogram given as (upper bound, count in that bucket),
    bounds ascending (the last may be +Inf): linear within the bucket it falls in."""
    total = sum(n for _, n in buckets)
    if total <= 0:
        return None
    rank, seen, lower = q * total, 0.0, 0.0
    for upper, n in buckets:
        if n > 0 and seen + n >= rank:
            if upper == float("inf"):
                return lower  # beyond the last finite bound: say that bound
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
        lower = upper if upper != float("inf") else lower
    return lower


def minutes(rows: Sequence[dict[str, Any]], since: datetime, count: int) -> list[dict[str, Any]]:
    """Per minute from ``since`` (``count`` of them, empty minutes included): finished by
    status, claims, run-time percentiles (seconds, or None without runs)."""
    finished: dict[datetime, dict[str, float]] = defaultdict(dict)
    claims: dict[datetime, float] = defaultdict(float)
    runs: dict[datetime, dict[float, float]] = defaultdict(dict)
    for r in rows:
        m = r["minute"]
        if r["name"] == "finished":
            finished[m][r["label"]] = finished[m].get(r["label"], 0) + r["value"]
        elif r["name"] == "wait":
            claims[m] += r["value"]
        elif r["name"] == "run":
            runs[m][r["le"]] = runs[m].get(r["le"], 0) + r["value"]
    out = []
    for i in range(count):
        m = since + timedelta(minutes=i)
        buckets = sorted(runs.get(m, {}).items())
        entry: dict[str, Any] = {"minute": m, "finished": {k: int(v) for k, v in
                                                           finished.get(m, {}).items()},
                                 "claims": int(claims.get(m, 0))}
        for q in QUANTILES:
            entry[f"run_p{round(q * 100)}"] = quantile(q, buckets)
        out.append(entry)
    return out


def flags(queue: dict[str, Any], last_claim: datetime | None, now: datetime,
          ever_claimed: bool) -> dict[str, Any]:
    """What the queue page warns about: ``stalled`` (ready work older than five minutes and
    no claim in that time) and ``never_served`` (ready work, and no worker has ever claimed
    a job of this queue: no pool may serve it)."""
    ready = int(queue.get("pending", 0)) > 0
    old = float(queue.get("oldest_ready_age_seconds") or 0) > STALLED_AFTER.total_seconds()
    recent = last_claim is not None and now - last_claim < STALLED_AFTER
    return {"stalled": bool(ready and old and not recent and not queue.get("paused")),
            "never_served": bool(ready and not ever_claimed),
            "last_claim_at": last_claim}
