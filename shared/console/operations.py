"""The API's routes for operating a running installation: retry and cancel a selection
(one request, a count back), a command's env values for an operator who asks (audited), a
job's whole output, schedules, and the queue page's chart and warnings. Each is a store
verb the CLI also has (``jobfence.bulk``, ``Schedules``, ``jobfence.joblogs``), answered
like every other route of ``jobfence.console.api`` (``jobfence.console.calls``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from starlette.routing import Route

from jobfence import bulk
from jobfence.console import params
from jobfence.console.bounds import (
    ANSWER_BYTES,
    LISTED_SCHEDULE_BYTES,
    LOG_ANSWER_BYTES,
    fit_events,
    fit_job,
    fit_schedule,
    page,
    size,
    slim,
)
from jobfence.console.calls import Answer, Call, Routes
from jobfence.console.queue_history import flags, minutes
from jobfence.errors import Conflict, InvalidSpec, JobNotFound, NotFound, ObjectStoreError
from jobfence.joblogs import STREAM_NAMES, Logs
from jobfence.limits import queue_name
from jobfence.schedules import Cron, job_template, schedule_name, schedule_spec
from jobfence.store import Store
from jobfence.views import group_view, schedule_view

V1 = "/api/v1"
SHOWN_IDS = 1000
"""A dry run answers at most this many of the ids it would touch (and how many in all)."""
HISTORY_QUERY = {"minutes": params.Param(params.whole("minutes", 1, 1440), 60)}
LOGS_QUERY = {
    "attempt": params.Param(params.whole("attempt", 1, 1_000_000), None),
    "action": params.Param(params.whole("action", 0, 1_000_000), None),
    "stream": params.Param(params.one_of("stream", STREAM_NAMES), None),
    "offset": params.Param(params.whole("offset", 0, 2**62), 0),
    "only": params.Param(params.one_of("only", ("true", "false")), "false"),
}
ACTIONS_QUERY = {"from": params.Param(params.whole("from", 0, 1_000_000), 0)}
SCHEDULES_QUERY = {"after": params.Param(params.text_of("after", 63), None),
                   "limit": params.Param(params.whole("limit", 1, 500), 100)}


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


def act(server: Routes, verb: str) -> Any:
    def handler(store: Store, call: Call) -> Answer:

        body = _object(call.body if call.body is not None else {})
        sel = selection(body)
        sel.check(verb)
        limit = body.get("limit", bulk.DEFAULT_LIMIT)
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

    body = _object(call.body if call.body is not None else {})
    reason = _text(body, "reason", 2000)
    if not reason:
        raise InvalidSpec('say why: {"reason": "..."} (it is recorded)')
    job_id = call.path["job_id"]
    env = store.jobs.reveal_env(job_id=job_id, actor=call.caller.user, reason=reason)
    return Answer({"job_id": job_id, "actions": env})


def list_schedules(store: Store, call: Call) -> Answer:
    """Schedules by name, a page at a time: at most ``limit`` and ANSWER_BYTES, each
    within LISTED_SCHEDULE_BYTES; ``next`` is the page after."""

    limit = call.params["limit"]
    rows = store.schedules.page(after=call.params["after"], limit=limit)
    shown, full = page((schedule_view(r) for r in rows),
                       lambda v: fit_schedule(v, LISTED_SCHEDULE_BYTES))
    following = None
    if shown and (full or len(rows) == limit):
        following = f"{V1}/schedules?{urlencode({'limit': limit, 'after': shown[-1]['name']})}"
    return Answer({"schedules": shown, "next": following},
                  headers={"link": f'<{following}>; rel="next"'} if following else {})


def get_schedule(store: Store, call: Call) -> Answer:

    name = schedule_name(call.path["name"])
    out = schedule_view(store.schedules.get(name))
    out["ticks"] = [t._asdict() for t in store.schedules.ticks(name)]
    return Answer(fit_schedule(out, ANSWER_BYTES))


EVENTS_BYTES = ANSWER_BYTES // 4
"""What a job's audit trail may take of its answer (the newest events)."""


def get_job(store: Store, call: Call) -> Answer:
    """One job within ANSWER_BYTES: its newest events within EVENTS_BYTES
    (``events_omitted`` the older ones), its actions whole while they fit (the rest at
    ``actions_next``)."""
    from jobfence.views import attempts_of, job_views

    job_id = call.path["job_id"]
    row = store.jobs.get(job_id)
    if row is None:
        raise JobNotFound(job_id)
    view = job_views(store, [row])[0]
    events = store.jobs.events(job_id)
    view["attempts"] = [] if row.is_parent else attempts_of(events)  # children run it
    view["events"], omitted = fit_events(events, EVENTS_BYTES)
    if omitted:
        view["events_omitted"] = omitted
    return Answer(fit_job(view, ANSWER_BYTES))


def job_actions(store: Store, call: Call) -> Answer:
    """A job's actions whole from ``from`` on, at most ANSWER_BYTES an answer (one that
    alone is larger comes slim); ``next`` the rest. Where a job's page links past its
    bound."""
    from jobfence.views import job_views

    job_id = call.path["job_id"]
    row = store.jobs.get(job_id)
    if row is None:
        raise JobNotFound(job_id)
    actions = job_views(store, [row])[0]["actions"]
    at = call.params["from"]
    shown: list[dict[str, Any]] = []
    used = 1024
    while at < len(actions):
        action = {"index": at, **actions[at]}
        cost = size(action) + 1
        if used + cost > ANSWER_BYTES:
            if shown:
                break
            action = {"index": at, **slim(actions[at])}  # alone past the bound: slim
        shown.append(action)
        used += cost
        at += 1
    following = f"{V1}/jobs/{job_id}/actions?from={at}" if at < len(actions) else None
    return Answer({"job_id": str(job_id), "actions": shown, "next": following},
                  headers={"link": f'<{following}>; rel="next"'} if following else {})


def add_schedule(server: Routes) -> Any:
    def handler(store: Store, call: Call) -> Answer:

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

    queue = call.path["queue"]
    count = call.params["minutes"]
    now = store.schedules.clock()
    since = now.replace(second=0, microsecond=0) - timedelta(minutes=count - 1)
    rows = store.job_metrics.history(queue=queue, since=since)
    return Answer({"queue": queue, "minutes": minutes(rows, since, count)})


def queue_groups(store: Store, call: Call) -> Answer:
    """A queue's groups with active jobs (GET); with a body (POST), first set its limit on
    each group's running jobs (``group_limit``, null: none) and round-robin (``fair``)."""
    try:
        queue = queue_name(call.path["queue"])
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None
    if call.body is not None:
        body = call.body if isinstance(call.body, dict) else {}
        unknown = set(body) - {"group_limit", "fair"}
        limit, fair = body.get("group_limit"), body.get("fair")
        if not body or unknown or (limit is not None and not (
                type(limit) is int and 0 <= limit <= 1_000_000)) or (
                fair is not None and not isinstance(fair, bool)):
            raise InvalidSpec('give {"group_limit": 0 to 1000000 or null} and/or '
                              '{"fair": true or false}')
        if "group_limit" in body:
            store.queues.set_groups(queue, group_limit=limit, set_group_limit=True,
                                    actor=call.caller.user)
        if fair is not None:
            store.queues.set_groups(queue, fair=fair, actor=call.caller.user)
    return Answer({"queue": queue,
                   "groups": [group_view(g) for g in store.queues.groups(queue)]})


def queue_flags(store: Store, queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The queues with their warnings (``stalled``, ``never_served``, ``last_claim_at``),
    and those idle now that finished or claimed anything in the last hour."""
    now = store.schedules.clock()
    listed = {q["queue"] for q in queues}
    queues = queues + [  # idle now, busy within the hour: the page charts them too
        {"queue": name, "paused": False, "limit": None, "pending": 0, "scheduled": 0,
         "running": 0, "waiting": 0, "oldest_ready_age_seconds": 0.0,
         "group_limit": None, "fair": False}
        for name in store.job_metrics.recent_queues() if name not in listed]
    claims = store.job_metrics.claims([q["queue"] for q in queues])
    out = []
    for q in queues:
        last, ever = claims.get(q["queue"], (None, False))
        out.append({**q, **flags(q, last, now, ever)})
    return out


def _utf8_cut(data: bytes, most: int) -> int:
    """Where to cut ``data`` at or before ``most`` bytes without splitting a character."""
    n = min(most, len(data))
    while 0 < n < len(data) and data[n] & 0xC0 == 0x80:
        n -= 1
    return n


def _page_of(logs: Logs, job_id: Any, attempt: Any, piece: Any, *, offset: int,
             room: int) -> tuple[bytes, bool]:
    """At most ``room`` bytes of ``piece`` from ``offset`` on, once encoded in the answer
    (an escaped control character takes six), and whether the stream goes on past them."""
    shown = bytearray()
    cut = False
    for data in logs.read_at(job_id, attempt, piece, offset):
        take = _utf8_cut(data, room - len(shown))
        shown += data[:take]
        if take < len(data):
            cut = True
            break
    while shown and (cost := size(shown.decode("utf-8", errors="replace"))) > room:
        cut = True  # escapes made it larger than it is: shrink in proportion
        del shown[_utf8_cut(bytes(shown), max(0, len(shown) * room // cost - 1)):]
    return bytes(shown), cut


def job_logs(server: Routes) -> Any:
    """An attempt's output (``jobfence.joblogs``), at most LOG_ANSWER_BYTES an answer, from
    a place in it (``action``, ``stream``, ``offset``) on; ``next`` says where the rest
    starts."""
    def handler(store: Store, call: Call) -> Answer:
        from jobfence.adapters import open_object_store

        settings = server.settings
        installation = store.control.identity(settings.installation).installation
        assert installation is not None
        logs = Logs(store, (lambda: open_object_store(settings)) if settings.s3_bucket
                    else None, settings.s3_bucket, installation)
        job_id, q = call.path["job_id"], call.params
        attempt = logs.attempt(job_id, q["attempt"])
        every = logs.pieces(job_id, attempt)
        start = 0
        if q["action"] is not None or q["stream"] is not None:
            start = next((i for i, p in enumerate(every)
                          if q["action"] in (None, p.action_index)
                          and q["stream"] in (None, p.stream)), -1)
            if start < 0:
                raise NotFound(f"attempt {attempt.number} of job {job_id} has no such "
                               "output (action, stream)")
        chosen = every[start:start + 1] if q["only"] == "true" else every[start:]
        room = LOG_ANSWER_BYTES - 1024  # the answer's own fields and the next link
        pieces: list[dict[str, Any]] = []
        resume: tuple[Any, int] | None = None
        for k, piece in enumerate(chosen):
            offset = q["offset"] if k == 0 else 0
            entry: dict[str, Any] = {
                "action": piece.action_index, "name": piece.action, "stream": piece.stream,
                "size": piece.size, "on_s3": piece.on_s3, "offset": offset, "whole": False,
                "text": "", "cut_at": None, "unavailable": None}
            room -= size(entry) + 1
            if pieces and room <= 0:
                resume = (piece, 0)
                break
            try:
                shown, cut = _page_of(logs, job_id, attempt, piece, offset=offset,
                                      room=max(0, room))
            except (NotFound, ObjectStoreError) as exc:  # no bucket or no S3 access here
                shown, cut, entry["unavailable"] = b"", False, str(exc)
            entry["text"] = shown.decode("utf-8", errors="replace")
            room -= size(entry["text"])
            entry["whole"] = (piece.whole and offset == 0 and not cut
                              and entry["unavailable"] is None)
            if cut:
                entry["cut_at"] = offset + len(shown)
                resume = (piece, offset + len(shown))
            pieces.append(entry)
            if cut:
                break
        following = None
        if resume is not None:
            piece, at = resume
            query = {"attempt": attempt.number, "action": piece.action_index,
                     "stream": piece.stream, "offset": at,
                     **({"only": "true"} if q["only"] == "true" else {})}
            following = f"{V1}/jobs/{job_id}/logs?{urlencode(query)}"
        return Answer({"job_id": str(job_id), "attempt": attempt.number,
                       "running": attempt.running, "pieces": pieces, "next": following},
                      headers={"link": f'<{following}>; rel="next"'} if following else {})
    return handler


def routes(server: Routes) -> list[Route]:
    r = server.route
    return [
        r(f"{V1}/jobs/retry", act(server, "retry"), method="POST", operate=True),
        r(f"{V1}/jobs/cancel", act(server, "cancel"), method="POST", operate=True),
        r(f"{V1}/jobs/{{job_id}}/env", reveal_env, method="POST", operate=True),
        r(f"{V1}/jobs/{{job_id}}/logs", job_logs(server), query=LOGS_QUERY),
        r(f"{V1}/jobs/{{job_id}}/actions", job_actions, query=ACTIONS_QUERY),
        r(f"{V1}/schedules", list_schedules, query=SCHEDULES_QUERY),
        r(f"{V1}/schedules", add_schedule(server), method="POST", operate=True),
        r(f"{V1}/schedules/{{name}}", get_schedule),
        *[r(f"{V1}/schedules/{{name}}/{verb}", pause_schedule(verb), method="POST",
            operate=True) for verb in ("pause", "resume", "delete")],
        r(f"{V1}/queues/{{queue}}/history", queue_history, query=HISTORY_QUERY),
        r(f"{V1}/queues/{{queue}}/groups", queue_groups),
        r(f"{V1}/queues/{{queue}}/groups", queue_groups, method="POST", operate=True),
    ]
