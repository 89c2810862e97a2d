"""How large an answer of the API may be, and how an answer is kept within it.

A job may hold 1,000 actions, each with a result of up to 256 KiB and output tails; a spec
may be 64 MiB; an attempt's output on S3 is unbounded. An answer built from all of it
would be as large, and ``serve`` would hold it whole in memory while it encodes it (one
60-action job's output was a 126 MB answer). So every answer has a total size, counted as
it is sent (JSON, UTF-8): ``ANSWER_BYTES``, and ``LOG_ANSWER_BYTES`` for an attempt's
output. Past it, an answer stops where it is and says where the rest is: a list pages on
(``next``), a job's actions past its bound are answered by name and status only, the rest
at ``actions_next``; an output continues at ``next``. docs/REFERENCE.md ("The HTTP API")
lists each bound.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from jobfence.jsonable import to_jsonable

ANSWER_BYTES = 4 * 2**20
"""The most any answer of the API holds (a job, a page of jobs or schedules, a schedule)."""

LOG_ANSWER_BYTES = 2**20
"""The most text one answer of ``GET /jobs/ID/logs`` holds; the rest is at its ``next``."""

LISTED_JOB_BYTES = 64 * 2**10
"""What one job of a list holds at most: its actions' results past it are at the job's
own ``actions_next`` (a list shows what jobs there are, a job's page what each did)."""

LISTED_SCHEDULE_BYTES = 256 * 2**10
"""What one schedule of ``GET /schedules`` holds at most: past it, its spec's actions
are listed by name, and the schedule's own route answers the rest."""

HEAVY = ("params", "result", "error_detail")
"""What an action may carry in bulk: its input, its result (output tails), a traceback."""


def size(value: Any) -> int:
    """Bytes ``value`` takes in an answer: JSON as ``JSONResponse`` writes it, UTF-8."""
    return len(json.dumps(to_jsonable(value), ensure_ascii=False, separators=(",", ":"))
               .encode())


def slim(action: dict[str, Any]) -> dict[str, Any]:
    """An action without what it carries in bulk, and saying so (``cut``)."""
    out = {k: v for k, v in action.items() if k not in HEAVY}
    out["cut"] = True
    return out


def fit_job(view: dict[str, Any], budget: int) -> dict[str, Any]:
    """``view`` within ``budget`` bytes where it can be: its actions whole, in order, while
    they fit; every later one slim, and ``actions_next`` the route that answers them whole
    (a job's own fields and its actions' names are always answered)."""
    actions: list[dict[str, Any]] = view["actions"]
    if size(view) <= budget:
        return view
    slims = [slim(a) for a in actions]
    link = f"/api/v1/jobs/{view['job_id']}/actions?from=0"
    room = budget - size({**view, "actions": slims, "actions_next": link})
    kept = 0
    for whole, cut in zip(actions, slims, strict=True):
        cost = size(whole) - size(cut)
        if cost > room:
            break
        room -= cost
        kept += 1
    return {**view, "actions": actions[:kept] + slims[kept:],
            "actions_next": f"/api/v1/jobs/{view['job_id']}/actions?from={kept}"}


def fit_events(events: list[Any], budget: int) -> tuple[list[Any], int]:
    """The newest of ``events`` that fit in ``budget`` bytes, in order, and how many older
    ones were left out (``jobfence status JOB_ID --events`` shows every one)."""
    kept: list[Any] = []
    room = budget
    for e in reversed(events):
        room -= size(e) + 1
        if room < 0:
            break
        kept.append(e)
    kept.reverse()
    return kept, len(events) - len(kept)


def fit_schedule(view: dict[str, Any], budget: int) -> dict[str, Any]:
    """A schedule within ``budget`` where it can be: past it, its spec's actions by name
    only (``spec_cut``); ``jobfence schedule show NAME -o json`` shows it whole."""
    if size(view) <= budget:
        return view
    spec = dict(view["spec"])
    spec["actions"] = [{"name": a.get("name"), "cut": True} for a in spec.get("actions", [])]
    return {**view, "spec": spec, "spec_cut": True}


def page(items: Iterable[dict[str, Any]], fit: Callable[[dict[str, Any]], dict[str, Any]],
         budget: int = ANSWER_BYTES) -> tuple[list[dict[str, Any]], bool]:
    """``items`` each fitted (``fit``), taken in order while the answer stays within
    ``budget`` (1 KiB of it kept for the answer's own fields and its link; the first item
    always taken); and whether it stopped before the end. ``items`` is read lazily: what
    is not answered is never built."""
    out: list[dict[str, Any]] = []
    used = 1024
    for item in items:
        fitted = fit(item)
        cost = size(fitted) + 1
        if out and used + cost > budget:
            return out, True
        out.append(fitted)
        used += cost
    return out, False
