"""What `status` and `list` show: a job row plus its actions' statuses (derived from the
per-attempt results, never stored twice) and, for a parent, its children by status."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from jobfence.store import TERMINAL, Store
from jobfence.store.types import ActionResult, GroupStatus, JobEvent, JobRow, QueueStatus
from jobfence.terminal import harmless

_FIELDS = (
    "job_id", "status", "attempt_count", "max_attempts", "resource", "priority", "reason",
    "error", "created_at", "started_at", "finished_at", "claimed_by", "attempt_id",
    "parent_id", "labels", "idempotency_key", "ttl", "timeout", "expires_at", "manifest",
    "interruptions", "snoozes", "queue", "group", "run_at", "stopping_until",
)


MASK = "<masked>"
"""What an ``env`` value shows as: a command's environment often carries a secret, so only
its names are shown; an operator may ask for the values (``status --reveal-env``, audited)."""

SUMMARY_CHARS = 80


def shown_params(params: Any) -> dict[str, Any]:
    """An action's params as ``status``, the API and the console show them: everything but
    the values of ``env`` (any action's), which are masked."""
    if not isinstance(params, dict):
        return {}
    shown = dict(params)
    env = shown.get("env")
    if isinstance(env, dict):
        shown["env"] = {name: MASK for name in env}
    return shown


def summary(actions: Sequence[dict[str, Any]]) -> str:
    """A one-line summary of a job's first action, as ``list`` shows it: a command's argv
    joined (quoted where a shell would need it), else the action's name and its params
    (env masked); cut to 80 characters, and ``(+N)`` when more actions follow."""
    import json
    import shlex

    if not actions:
        return ""
    first = actions[0]
    params = first.get("params") or {}
    argv = params.get("argv") if isinstance(params, dict) else None
    if first.get("name") == "command" and isinstance(argv, list):
        text = shlex.join(str(a) for a in argv)
    else:
        shown = shown_params(params)
        text = str(first.get("name", ""))
        if shown:
            text += " " + json.dumps(shown, separators=(",", ":"), ensure_ascii=False)
    text = " ".join(text.split())  # one line, whatever the argv holds
    if len(text) > SUMMARY_CHARS:
        text = text[:SUMMARY_CHARS - 1] + "…"
    return text + (f" (+{len(actions) - 1})" if len(actions) > 1 else "")


def action_statuses(job: JobRow, results: Sequence[ActionResult]) -> list[dict[str, Any]]:
    """Each action's status in the job's current run (an operator's retry begins a new one,
    and what succeeded before it is done no longer): succeeded if an attempt of the run
    finished it; running if it is the first unfinished action of a running job; else its
    latest result; else pending (or skipped, once the job is terminal)."""
    results = [r for r in results if r.run == job.run]
    succeeded = {r.action_index for r in results if r.status == "succeeded"}
    latest = {r.action_index: r for r in results}
    first_open = next((i for i in range(len(job.actions)) if i not in succeeded), None)
    out = []
    for i, action in enumerate(job.actions):
        if job.is_parent:  # a parent runs nothing itself: its children do
            out.append({"name": action["name"], "status": job.status,
                        "params": shown_params(action.get("params"))})
            continue
        if i in succeeded:
            status = "succeeded"
        elif job.status == "running" and i == first_open:
            status = "running"
        elif i in latest:
            status = latest[i].status
        else:
            status = "skipped" if job.status in TERMINAL else "pending"
        entry: dict[str, Any] = {"name": action["name"], "status": status,
                                 "params": shown_params(action.get("params"))}
        if action.get("inactivity_timeout"):
            entry["inactivity_timeout"] = action["inactivity_timeout"]
        if i in latest and latest[i].error and status != "succeeded":
            entry["error"] = latest[i].error
            if latest[i].error_detail:
                entry["error_detail"] = latest[i].error_detail
        if i in latest and isinstance(latest[i].result, dict):
            entry["result"] = latest[i].result  # exit code, output tails, outputs...
        out.append(entry)
    return out


def attempts_of(events: Sequence[JobEvent]) -> list[dict[str, Any]]:
    """A job's attempts read from its audit trail: each claim (who claimed it, when) and how
    it ended (the state it left ``running`` for, and why) — or still running. A claim's
    ``number`` is the attempt it ran as, as ``status`` counts them (``attempt 2/3``) and the
    worker's output lines say: a claim after a snooze or a SIGTERM give-back (which spend no
    attempt) has the number of the one before, and a retry counts from 1 again. (A claim
    recorded before the database kept that number is numbered by its place.)"""
    attempts: list[dict[str, Any]] = []
    for e in events:
        if e.to_status == "running" and e.from_status != "running":
            reason = e.reason or ""
            number = e.attempt if e.attempt else len(attempts) + 1
            attempts.append({"number": number, "attempt_id": None,
                             "claimed_by": reason.removeprefix("claimed by ")
                             if reason.startswith("claimed by ") else None,
                             "started_at": e.at, "ended_at": None, "outcome": "running",
                             "reason": None})
        elif e.from_status == "running" and attempts and attempts[-1]["ended_at"] is None:
            attempts[-1].update(attempt_id=e.attempt_id, ended_at=e.at, outcome=e.to_status,
                                reason=e.reason)
    return attempts


def job_views(store: Store, rows: Sequence[JobRow]) -> list[dict[str, Any]]:
    results: dict[UUID, list[ActionResult]] = {}
    for r in store.jobs.action_results([row.job_id for row in rows]):
        results.setdefault(r.job_id, []).append(r)
    views = []
    for row in rows:
        view = {k: getattr(row, k) for k in _FIELDS}
        view["after"] = list(row.after)
        view["lease_expires_at"] = (row.visible_at if row.status == "running"
                                    and not row.is_parent else None)
        view["actions"] = action_statuses(row, results.get(row.job_id, []))
        view["summary"] = summary(row.actions)
        quiet = {a.get("inactivity_timeout") for a in row.actions}
        view["inactivity_timeout"] = quiet.pop() if len(quiet) == 1 else None
        if row.is_parent:
            counts = store.jobs.children_counts(row.job_id)
            view["children"] = {"total": sum(counts.values()), **counts}
        views.append(view)
    return views


def render_text(view: dict[str, Any]) -> str:
    """A person's view of one job."""
    lines = [f"job {view['job_id']}  {view['status'].upper()}  "
             f"(attempt {view['attempt_count']}/{view['max_attempts']})"]
    facts = [("queue", view["queue"]), ("group", view["group"]),
             ("resource", view["resource"]),
             ("priority", view["priority"]), ("scheduled for", view["run_at"]),
             ("parent", view["parent_id"]), ("claimed by", view["claimed_by"]
                                                 if view["status"] == "running" else None),
             ("created", view["created_at"]), ("started", view["started_at"]),
             ("finished", view["finished_at"]),
             ("stopping until", view["stopping_until"]), ("reason", view["reason"]),
             ("error", view["error"]), ("manifest", view["manifest"])]
    lines += [f"  {k}: {v}" for k, v in facts if v not in (None, "")]
    if view["after"]:
        lines.append(f"  after: {', '.join(str(a) for a in view['after'])}")
    if "children" in view:
        counts = ", ".join(f"{k} {v}" for k, v in view["children"].items() if k != "total")
        lines.append(f"  children: {view['children']['total']} ({counts})")
    lines.append("  actions:")
    for i, a in enumerate(view["actions"], 1):
        err = f"  - {a['error']}" if a.get("error") else ""
        result = a.get("result") or {}
        code = f" (exit {result['exit_code']})" if "exit_code" in result else ""
        lines.append(f"    {i}. {a['name']:<12} {a['status']}{code}{err}")
        if a.get("inactivity_timeout"):
            lines.append(f"         inactivity timeout: {a['inactivity_timeout']}")
        if isinstance(used := result.get("usage"), dict):
            lines.append(f"         used: {used.get('cpu_seconds')} s CPU, "
                         f"{_mib(used.get('peak_memory_bytes'))} peak memory")
        params = a.get("params") or {}
        if isinstance(params.get("argv"), list):
            import shlex

            lines.append(f"         argv: {shlex.join(str(x) for x in params['argv'])}")
        env = params.get("env") or {}
        if env and all(v == MASK for v in env.values()):
            lines.append(f"         env: {', '.join(sorted(env))} (values masked)")
        else:
            lines += [f"         env: {k}={v}" for k, v in sorted(env.items())]
        rest = {k: v for k, v in params.items() if k not in ("argv", "env")}
        if rest:
            lines.append(f"         params: {rest}")
        for label, text in (("stdout", result.get("stdout_tail")),
                            ("stderr", result.get("stderr_tail") or a.get("error_detail"))):
            tail = (text or "").rstrip().splitlines()[-5:]
            lines += [f"         {label} | {line}" for line in tail]
        lines += [f"         output: {url}" for url in result.get("outputs") or []]
        if result.get("output_on_s3"):
            lines.append(f"         whole output: jobfence logs {view['job_id']}")
    return harmless("\n".join(lines))  # what a job carries may hold escape sequences


def _mib(value: object) -> str:
    return f"{value / 2**20:.1f} MiB" if isinstance(value, int) else "unknown"


def schedule_view(row: Any) -> dict[str, Any]:
    """A schedule as ``schedule show -o json`` and the API show it (env values masked)."""
    spec = dict(row.spec)
    spec["actions"] = [{**a, "params": shown_params(a.get("params"))}
                       for a in spec.get("actions", [])]
    return {"name": row.name, "cron": row.cron, "timezone": row.timezone,
            "paused": row.paused, "next_tick_at": None if row.paused else row.next_tick_at,
            "last_tick_at": row.last_tick_at, "last_job_id": row.last_job_id, "spec": spec,
            "created_at": row.created_at, "created_by": row.created_by,
            "changed_at": row.changed_at, "changed_by": row.changed_by}


def queue_view(row: QueueStatus) -> dict[str, Any]:
    """A queue as the CLI and the API show it: its rate one object (or null), with the
    starts of the last period."""
    view: dict[str, Any] = row._asdict()
    limit, period, started = (view.pop("rate_limit"), view.pop("rate_period_seconds"),
                              view.pop("rate_started"))
    view["rate"] = None if limit is None else {
        "limit": limit, "period_seconds": period, "started": started}
    return view


def group_view(row: GroupStatus) -> dict[str, Any]:
    """One group of a queue as the CLI, the API and the console show it."""
    return row._asdict()


def empty_queue_view(queue: str) -> dict[str, Any]:
    """A queue nothing has touched yet."""
    return queue_view(QueueStatus(queue, False, None, 0, 0, 0, 0, 0.0))
