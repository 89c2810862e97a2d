"""The API's routes for the second day: retry and cancel a selection (one request, a count
back), a command's env values for an operator who asks (audited), a job's whole output,
schedules, and the queue page's chart and warnings. Each is a store verb the CLI also has
(``jobfence.bulk``, ``Schedules``, ``jobfence.joblogs``), answered like every other route
of ``jobfence.console.api``."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from jobfence import bulk
from jobfence.console import params
from jobfence.console.queue_history import flags, minutes
from jobfence.errors import Conflict, InvalidSpec, NotFound, ObjectStoreError
from jobfence.joblogs import Logs
from jobfence.schedules import Cron, job_template, schedule_name, schedule_spec
from jobfence.spec import queue_name
from jobfence.store import Store
from jobfence.views import schedule_view

if TYPE_CHECKING:
    from jobfence.console.api import Answer, Call, Server

V1 = "/api/v1"
DEFAULT_LIMIT = 1000
SHOWN_IDS = 1000
"""A dry run answers at most this many of the ids it would touch (and how many in all)."""
HISTORY_QUERY = {"minutes": params.Param(params.whole("minutes", 1, 1440), 60)}
LOGS_QUERY = {"attempt": params.Param(params.whole("attempt", 1, 1_000_000), None)}
SHOWN_LOG_BYTES = 1024 * 1024
"""What ``GET /jobs/ID/logs`` answers of each stream at most (the console's job page)."""


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidSpec("the body must be a JSON object")
    return body


def _text(body: dict[str, Any], key: str, most: int = 1000) -> str | None:
    value = body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > most:
        raise InvalidSpec(f"{key} must be text of at most {most} characters")
    return value


def selection(body: dict[str, Any]) -> bulk.Selection:
    """A bulk request's selection: ``job_ids``, or ``status`` (one or a list) with the
    filters of ``GET /api/v1/jobs`` and ``before``/``after`` times."""
    known = {"job_ids", "status", "queue", "resource", "parent", "label", "before", "after",
             "limit", "dry_run", "reason"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidSpec(f"unknown field {unknown[0][:40]!r} (one of {', '.join(sorted(known))})")
    ids = body.get("job_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise InvalidSpec("job_ids must be a list of job ids")
    status = body.get("status") or []
    statuses = [status] if isinstance(status, str) else status
    if not isinstance(statuses, list) or not all(isinstance(s, str) for s in statuses):
        raise InvalidSpec("status must be a status or a list of them")
    label = body.get("label") or {}
    if isinstance(label, str):
        label = params.labels(label)
    if not isinstance(label, dict) or not all(isinstance(v, str) for v in label.values()):
        raise InvalidSpec('label must be {"key": "value"} or "key=value"')
    queue, parent = _text(body, "queue", 63), _text(body, "parent", 100)
    before, after = _text(body, "before", 100), _text(body, "after", 100)
    try:
        return bulk.Selection(
            statuses=tuple(dict.fromkeys(statuses)),
            queue=queue_name(queue) if queue else None, resource=_text(body, "resource", 500),
            parent_id=params.job_id(parent) if parent else None, labels=label,
            created_before=bulk.parse_time(before, "before") if before else None,
            created_after=bulk.parse_time(after, "after") if after else None,
            job_ids=tuple(params.job_id(i) for i in ids))
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None


def act(server: Server, verb: str) -> Any:
    def handler(store: Store, call: Call) -> Answer:
        from jobfence.console.api import Answer

        body = _object(call.body if call.body is not None else {})
        sel = selection(body)
        sel.check(verb)
        limit = body.get("limit", DEFAULT_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) \
                or not 1 <= limit <= bulk.MAX_LIMIT:
            raise InvalidSpec(f"limit must be a number from 1 to {bulk.MAX_LIMIT}")
        dry = body.get("dry_run", False)
        if not isinstance(dry, bool):
            raise InvalidSpec("dry_run must be true or false")
        ceiling = bulk.ceiling_now(store)
        matched = bulk.count(store, sel, ceiling=ceiling, cap=bulk.MAX_LIMIT)
        if not dry and matched > limit:
            raise Conflict(f"{matched} jobs match, more than the limit {limit}: send "
                           f'"limit": {matched} to {verb} all of them, or narrow the '
                           "selection (nothing was written)")
        out = bulk.act(store, verb, sel, reason=bulk.said_by(
            verb, call.caller.user, _text(body, "reason", 2000)), limit=max(1, matched),
            batch=server.settings.batch_size, dry_run=dry, ceiling=ceiling)
        answer = out.as_json()
        if dry:
            answer["job_ids"] = answer["job_ids"][:SHOWN_IDS]
        server.log.info("bulk_action", verb=verb, by=call.caller.user, dry_run=dry,
                        matched=out.matched, done=out.done)
        return Answer(answer)
    return handler


def reveal_env(store: Store, call: Call) -> Answer:
    from jobfence.console.api import Answer

    body = _object(call.body if call.body is not None else {})
    reason = _text(body, "reason", 2000)
    if not reason:
        raise InvalidSpec('say why: {"reason": "..."} (it is recorded)')
    job_id = call.path["job_id"]
    env = store.jobs.reveal_env(job_id=job_id, actor=call.caller.user, reason=reason)
    return Answer({"job_id": job_id, "actions": env})


def list_schedules(store: Store, call: Call) -> Answer:
    from jobfence.console.api import Answer

    rows, after = [], None
    while page := store.schedules.page(after=after):
        rows += [schedule_view(r) for r in page]
        after = page[-1].name
    return Answer({"schedules": rows})


def get_schedule(store: Store, call: Call) -> Answer:
    from jobfence.console.api import Answer

    name = schedule_name(call.path["name"])
    out = schedule_view(store.schedules.get(name))
    out["ticks"] = [t._asdict() for t in store.schedules.ticks(name)]
    return Answer(out)


def add_schedule(server: Server) -> Any:
    def handler(store: Store, call: Call) -> Answer:
        from jobfence.console.api import Answer

        body = _object(call.body)
        unknown = sorted(set(body) - {"name", "cron", "timezone", "spec"})
        if unknown:
            raise InvalidSpec(f"unknown field {unknown[0][:40]!r}")
        name = schedule_name(_text(body, "name", 63) or "")
        cron = Cron.parse(_text(body, "cron", 200) or "", _text(body, "timezone", 100) or "UTC")
        spec, shown = schedule_spec(body.get("spec"))
        first = cron.after(store.schedules.clock())  # the database's clock, as every tick
        assert first is not None
        row = store.schedules.add(
            name=name, cron=cron.expr, timezone=cron.tz.key, spec=shown,
            job=job_template(spec, name, server.settings.max_attempts), next_tick_at=first,
            actor=call.caller.user)
        return Answer(schedule_view(row), 201, {"location": f"{V1}/schedules/{name}"})
    return handler


def pause_schedule(verb: str) -> Any:
    def handler(store: Store, call: Call) -> Answer:
        from jobfence.console.api import Answer

        name = schedule_name(call.path["name"])
        nxt = None
        if verb == "resume":
            row = store.schedules.get(name)
            nxt = Cron.parse(row.cron, row.timezone).after(store.schedules.clock())
        if verb == "delete":
            row = store.schedules.delete(name=name, actor=call.caller.user)
        else:
            row = store.schedules.set_paused(name=name, paused=verb == "pause",
                                             next_tick_at=nxt, actor=call.caller.user)
        return Answer(schedule_view(row))
    return handler


def queue_history(store: Store, call: Call) -> Answer:
    from jobfence.console.api import Answer

    queue = call.path["queue"]
    count = call.params["minutes"]
    now = store.schedules.clock()
    since = now.replace(second=0, microsecond=0) - timedelta(minutes=count - 1)
    rows = store.job_metrics.history(queue=queue, since=since)
    return Answer({"queue": queue, "minutes": minutes(rows, since, count)})


def queue_flags(store: Store, queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The queues with their warnings (``stalled``, ``never_served``, ``last_claim_at``),
    and those idle now that finished or claimed anything in the last hour."""
    now = store.schedules.clock()
    listed = {q["queue"] for q in queues}
    queues = queues + [  # idle now, busy within the hour: the page charts them too
        {"queue": name, "paused": False, "limit": None, "pending": 0, "scheduled": 0,
         "running": 0, "waiting": 0, "oldest_ready_age_seconds": 0.0}
        for name in store.job_metrics.recent_queues() if name not in listed]
    claims = store.job_metrics.claims([q["queue"] for q in queues])
    out = []
    for q in queues:
        last, ever = claims.get(q["queue"], (None, False))
        out.append({**q, **flags(q, last, now, ever)})
    return out


def job_logs(server: Server) -> Any:
    """An attempt's output (``jobfence.joblogs``): each stream's first SHOWN_LOG_BYTES."""
    def handler(store: Store, call: Call) -> Answer:
        from jobfence.console.api import Answer
        from jobfence.wiring import open_object_store

        settings = server.settings
        installation = store.control.identity(settings.installation).installation
        assert installation is not None
        logs = Logs(store, (lambda: open_object_store(settings)) if settings.s3_bucket
                    else None, settings.s3_bucket, installation)
        job_id = call.path["job_id"]
        attempt = logs.attempt(job_id, call.params["attempt"])
        pieces = []
        for piece in logs.pieces(job_id, attempt):
            shown, cut, unavailable = bytearray(), False, None
            try:
                for _, data in logs.read(job_id, attempt, piece):
                    room = SHOWN_LOG_BYTES - len(shown)
                    shown += data[:room]
                    if len(data) > room:
                        cut = True
                        break
            except (NotFound, ObjectStoreError) as exc:  # no bucket or no S3 access here
                unavailable = str(exc)
            pieces.append({"action": piece.action_index, "name": piece.action,
                           "stream": piece.stream, "size": piece.size, "on_s3": piece.on_s3,
                           "whole": piece.whole and not cut and unavailable is None,
                           "text": shown.decode("utf-8", errors="replace"),
                           "cut_at": len(shown) if cut else None,
                           "unavailable": unavailable})
        return Answer({"job_id": str(job_id), "attempt": attempt.number,
                       "running": attempt.running, "pieces": pieces})
    return handler


def routes(server: Server) -> list[Route]:
    r = server.route
    return [
        r(f"{V1}/jobs/retry", act(server, "retry"), method="POST", operate=True),
        r(f"{V1}/jobs/cancel", act(server, "cancel"), method="POST", operate=True),
        r(f"{V1}/jobs/{{job_id}}/env", reveal_env, method="POST", operate=True),
        r(f"{V1}/jobs/{{job_id}}/logs", job_logs(server), query=LOGS_QUERY),
        r(f"{V1}/schedules", list_schedules),
        r(f"{V1}/schedules", add_schedule(server), method="POST", operate=True),
        r(f"{V1}/schedules/{{name}}", get_schedule),
        *[r(f"{V1}/schedules/{{name}}/{verb}", pause_schedule(verb), method="POST",
            operate=True) for verb in ("pause", "resume", "delete")],
        r(f"{V1}/queues/{{queue}}/history", queue_history, query=HISTORY_QUERY),
    ]
