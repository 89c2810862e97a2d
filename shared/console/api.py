"""The JSON API under ``/api/v1/`` and the console's static files, as one ASGI application.

Every route is a plain function of (store, call) run on a worker thread with a connection
lent by the pool; errors are the CLI's typed errors, answered with the HTTP status of their
exit code (invalid 400, not found 404, conflict 409, unavailable 503; a body past the limit
413), as ``{"error": message}``. Each answer says how long the server took
(``Server-Timing``).

What a request says — its query, its path's parameters, its body — is read by
``jobfence.console.params`` against what its route declares, before the route runs: a
route only ever sees values it can use, and a malformed request is a 400, never a 500.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jobfence import db, logs
from jobfence.cluster import PERIODIC_FUNCTIONS, Cluster
from jobfence.console import operations, params, workflow_routes
from jobfence.console.auth import Authenticator, Caller, check_write
from jobfence.console.bounds import LISTED_JOB_BYTES, fit_job, page
from jobfence.console.calls import Answer, Call
from jobfence.console.openapi import document
from jobfence.errors import (
    ClusterError,
    ExitCode,
    Forbidden,
    InvalidSpec,
    JobfenceError,
    NotFound,
    RateLimited,
    TooLarge,
    Unauthenticated,
    Unavailable,
)
from jobfence.jsonable import to_jsonable
from jobfence.limits import MAX_SPEC_BYTES
from jobfence.settings import Settings
from jobfence.spec import parse_specs
from jobfence.store import ACTIVE, TERMINAL, Store
from jobfence.submit import cancelled_object, enqueued_object, submit
from jobfence.views import empty_queue_view, job_views, queue_view

PAGE_MAX = 500
"""The most jobs one page holds; page on with ``after`` (the ``next`` link)."""
VIEWS_AT_ONCE = 20
"""Jobs of a page whose results are read at once (a page stops at its byte bound)."""

JOBS_QUERY = {
    "status": params.Param(params.one_of("status", (*ACTIVE, *TERMINAL))),
    "queue": params.Param(params.queue),
    "resource": params.Param(params.text_of("resource", 500)),
    "label": params.Param(params.labels),
    "parent": params.Param(params.job_id),
    "after": params.Param(params.job_id),
    "limit": params.Param(params.whole("limit", 1, PAGE_MAX), 50),
}
FUNCTIONS_QUERY = {"runs": params.Param(params.whole("runs", 0, 200), 20)}
PATH_PARAMS: dict[str, Callable[[str], Any]] = {
    "job_id": params.job_id, "queue": params.queue, "name": str,
    "workflow_id": params.workflow_id}

STATUS = {ExitCode.INVALID: 400, ExitCode.NOT_FOUND: 404, ExitCode.CONFLICT: 409,
          ExitCode.UNAVAILABLE: 503, ExitCode.TIMEOUT: 504}
REFUSED: tuple[tuple[type[JobfenceError], int], ...] = (
    (Unauthenticated, 401), (Forbidden, 403), (TooLarge, 413), (RateLimited, 429),
    (ClusterError, 503))  # the cluster cannot be asked now: not the server's own fault
"""Errors whose HTTP status is not their exit code's (checked first, in this order)."""

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


@dataclass
class Server:
    settings: Settings
    pool: db.Pool
    auth: Authenticator
    cluster: Cluster | None
    reader: db.Pool | None = None
    """Connections of the reader's login, for the routes that only read (else ``pool``)."""
    max_body: int = MAX_SPEC_BYTES
    """The largest body read, in bytes: what ``enqueue --spec`` reads."""
    log: Any = field(default_factory=lambda: logs.get_logger("serve"))

    # -- plumbing -----------------------------------------------------------------------

    def route(self, path: str, handler: Callable[[Store, Call], Answer], *,
              method: str = "GET", operate: bool = False,
              query: Mapping[str, params.Param] | None = None) -> Route:
        """``handler`` at ``path``, taking the query parameters ``query`` declares (none
        by default: any other is a 400)."""
        declared = dict(query or {})

        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            caller: Caller | None = None
            read = method != "POST"  # whether the body was read to its end
            try:
                headers = {k.lower(): v for k, v in request.headers.items()}
                check_write(method, headers, request.scope.get("scheme", "http"))
                caller = await run_in_threadpool(self.auth.caller, headers)
                caller.require(operate=operate)
                given = params.parse_query(request.scope.get("query_string", b""), declared)
                where = {name: PATH_PARAMS[name](value)
                         for name, value in request.path_params.items()}
                body = await self._body(request) if method == "POST" else None
                read = True  # a POST's body was read to its end
                call = Call(caller, given.values, where, body, given.given,
                            traceparent=headers.get("traceparent"))
                answer = await run_in_threadpool(self._run, handler, call, operate)
            except JobfenceError as exc:
                answer = self._refusal(exc)
            except Exception:
                self.log.exception("request_failed", path=request.scope["path"])
                answer = Answer({"error": "internal error (see the server's log)"}, 500)
            took = (time.perf_counter() - started) * 1000
            if method == "POST":  # who changed what: every write, at info
                self.log.info("api_write", path=request.scope["path"], status=answer.status,
                              user=caller.user if caller else None, ms=round(took, 1))
            if not read:  # refused before its body ended: the client need not send the rest
                answer.headers["connection"] = "close"
            answer.headers.update({"server-timing": f"app;dur={took:.2f}",
                                   "cache-control": "no-store", **SECURITY_HEADERS})
            return JSONResponse(to_jsonable(answer.body), answer.status, answer.headers)

        return Route(path, endpoint, methods=[method])

    def _run(self, handler: Callable[[Store, Call], Answer], call: Call,
             operate: bool) -> Answer:
        pool = self.pool if operate or self.reader is None else self.reader
        with pool.connection() as conn:
            return handler(Store(conn, self.settings.schema_name), call)

    async def _body(self, request: Request) -> Any:
        """The body's JSON, read as it streams and never past ``max_body`` bytes (413)."""
        try:
            raw = await params.read_body(
                request.stream(), request.headers.get("content-length"), self.max_body)
        except ClientDisconnect:
            raise InvalidSpec("the client went away before the end of its body") from None
        if not raw.strip():
            return {}
        return params.parse_json(raw)

    def _refusal(self, exc: JobfenceError) -> Answer:
        status = next((code for kind, code in REFUSED if isinstance(exc, kind)),
                      STATUS.get(exc.exit_code, 500))
        headers: dict[str, str] = {}
        if isinstance(exc, Unauthenticated) and self.settings.auth == "tokenreview":
            headers["www-authenticate"] = 'Bearer realm="jobfence"'
        if isinstance(exc, RateLimited) and exc.retry_at is not None:
            wait = (exc.retry_at - datetime.now(UTC)).total_seconds()
            headers["retry-after"] = str(max(1, int(wait + 0.999)))
        return Answer({"error": str(exc)}, status, headers)

    # -- jobs ---------------------------------------------------------------------------

    def list_jobs(self, store: Store, call: Call) -> Answer:
        """A page of jobs: at most ``limit`` and ANSWER_BYTES (each job within
        LISTED_JOB_BYTES), built a few jobs at a time so that memory follows the answer."""
        q = call.params
        limit = q["limit"]
        rows = store.jobs.page(
            status=q["status"], resource=q["resource"], parent_id=q["parent"],
            queue=q["queue"], labels=q["label"], limit=limit, after=q["after"])
        chunks = (job_views(store, rows[i:i + VIEWS_AT_ONCE])
                  for i in range(0, len(rows), VIEWS_AT_ONCE))
        jobs, full = page((v for chunk in chunks for v in chunk),
                          lambda v: fit_job(v, LISTED_JOB_BYTES))
        headers: dict[str, str] = {}
        following = None
        if jobs and (full or len(rows) == limit):
            query = {k: v for k, v in call.given.items() if k != "after"}
            following = f"/api/v1/jobs?{urlencode({**query, 'after': str(jobs[-1]['job_id'])})}"
            headers["link"] = f'<{following}>; rel="next"'
        return Answer({"jobs": jobs, "next": following}, headers=headers)

    def submit_jobs(self, store: Store, call: Call) -> Answer:
        jobs = submit(self.settings, store, parse_specs(call.body), traceparent=call.traceparent,
                      reopen=lambda: Store(self.pool.fresh(), self.settings.schema_name))
        made = [enqueued_object(j) for j in jobs]
        self.log.info("jobs_submitted", by=call.caller.user, jobs=len(made))
        headers = {"location": f"/api/v1/jobs/{made[0]['job_id']}"} if made else {}
        return Answer(made if isinstance(call.body, list) else made[0], 202, headers)

    def cancel_job(self, store: Store, call: Call) -> Answer:
        job_id = call.path["job_id"]
        done = store.jobs.cancel(job_id=job_id, reason=_reason(call, "cancelled"))
        return Answer(cancelled_object(job_id, done))

    def retry_job(self, store: Store, call: Call) -> Answer:
        job_id = call.path["job_id"]
        t = store.jobs.retry(job_id=job_id, reason=_reason(call, "retried"))
        return Answer({"job_id": job_id, "status": t.status})

    # -- queues and drain ---------------------------------------------------------------

    def list_queues(self, store: Store, call: Call) -> Answer:
        queues = [queue_view(r) for r in store.queues.status()]
        return Answer({"queues": operations.queue_flags(store, queues)})

    def queue_verb(self, verb: str) -> Callable[[Store, Call], Answer]:
        def handler(store: Store, call: Call) -> Answer:
            queue = call.path["queue"]
            if verb == "pause":
                store.queues.configure(queue, paused=True, reason=_reason(call, "paused"),
                                       actor=call.caller.user)
            elif verb == "resume":
                store.queues.configure(queue, paused=False, actor=call.caller.user)
            else:
                limit = _body(call).get("limit")
                if limit is not None and not (isinstance(limit, int) and not isinstance(
                        limit, bool) and 0 <= limit <= 1_000_000):
                    raise InvalidSpec("limit must be a number from 0 to 1000000, or null")
                store.queues.configure(queue, limit=limit, set_limit=True,
                                       actor=call.caller.user)
            rows = store.queues.status(queue)
            return Answer(queue_view(rows[0]) if rows else empty_queue_view(queue))
        return handler

    def drain(self, store: Store, call: Call) -> Answer:
        if call.body is not None:
            on = _body(call).get("on")
            if not isinstance(on, bool):
                raise InvalidSpec('give {"on": true} or {"on": false} (and a "reason")')
            store.control.set_drain(on=on, reason=_reason(call, "drain " + (
                "on" if on else "off")), actor=call.caller.user)
        state = store.control.drain_status()
        return Answer({"installation": store.control.identity(
                           self.settings.installation).installation,
                       "draining": state.draining, "since": state.drain_changed_at,
                       "reason": state.drain_reason, "running": store.control.running_count(),
                       "scaler_value": store.queues.pending_total()})

    # -- functions ----------------------------------------------------------------------

    def list_functions(self, store: Store, call: Call) -> Answer:
        status = {s.function: s._asdict() for s in store.runs.function_status()}
        runs = store.runs.recent(limit=call.params["runs"])
        triggers = store.triggers.recent(limit=20)
        functions = [{"function": name, **{k: v for k, v in status.get(name, {}).items()
                                           if k != "function"},
                      "healthy": (status[name]["consecutive_failures"] < 3
                                  if name in status else None)}
                     for name in PERIODIC_FUNCTIONS]
        return Answer({"functions": functions, "runs": runs, "triggers": triggers,
                       "trigger_interval_seconds": self.settings.trigger_interval_seconds})

    def trigger(self, store: Store, call: Call) -> Answer:
        function = call.path["name"]
        if function not in PERIODIC_FUNCTIONS:
            raise NotFound(f"no periodic function {function[:80]!r} (one of "
                           f"{', '.join(PERIODIC_FUNCTIONS)})")
        if self.cluster is None:
            raise Unavailable(f"this server cannot start {function}: it has no cluster to "
                              "start it in (JOBFENCE_CLUSTER is none). Serve with "
                              "JOBFENCE_CLUSTER=kubernetes or local, or run `jobfence "
                              f"{function}` where the database can be reached")
        reason = _reason(call, "")
        if not reason.strip():
            raise InvalidSpec('say why: {"reason": "..."} (it is recorded with the run)')
        t = store.triggers.request(function=function, requested_by=call.caller.user,
                                   reason=reason,
                                   interval=self.settings.trigger_interval_seconds)
        try:
            name = self.cluster.trigger(function, requested_by=call.caller.user,
                                        reason=reason)
        except ClusterError as exc:
            store.triggers.failed(trigger_id=t.trigger_id, error=str(exc))
            self.log.warning("trigger_failed", function=function, by=call.caller.user,
                             error=str(exc))
            return Answer({"error": str(exc), "trigger_id": t.trigger_id}, 502)
        done = store.triggers.created(trigger_id=t.trigger_id, job_name=name)
        self.log.info("function_triggered", function=function, by=call.caller.user,
                      reason=reason, job=name)
        return Answer(done._asdict() if done else t._asdict(), 202)

    # -- the rest -----------------------------------------------------------------------

    def me(self, store: Store, call: Call) -> Answer:
        c = call.caller
        return Answer({"user": c.user, "groups": list(c.groups), "may_read": c.may_read,
                       "may_operate": c.may_operate, "auth": self.settings.auth})

    def app(self) -> Starlette:
        async def healthz(request: Request) -> Response:
            return JSONResponse({"ok": True})

        async def readyz(request: Request) -> Response:
            def ping() -> None:
                for pool in {id(p): p for p in (self.pool, self.reader) if p}.values():
                    with pool.connection() as conn:
                        Store(conn, self.settings.schema_name).control.schema_version()
            try:
                await run_in_threadpool(ping)
            except JobfenceError as exc:
                return JSONResponse({"ready": False, "error": str(exc)}, 503)
            return JSONResponse({"ready": True})

        async def openapi(request: Request) -> Response:
            return JSONResponse(document(), headers=SECURITY_HEADERS)

        async def index(request: Request) -> Response:
            page = resources.files("jobfence.console").joinpath("static/index.html")
            return Response(page.read_bytes(), media_type="text/html; charset=utf-8",
                            headers={**SECURITY_HEADERS, "cache-control": "no-cache"})

        v1 = "/api/v1"
        static = str(resources.files("jobfence.console").joinpath("static"))
        routes = [
            Route("/", index), Route("/healthz", healthz), Route("/readyz", readyz),
            Route(f"{v1}/openapi.json", openapi),
            self.route(f"{v1}/me", self.me),
            self.route(f"{v1}/jobs", self.list_jobs, query=JOBS_QUERY),
            self.route(f"{v1}/jobs", self.submit_jobs, method="POST", operate=True),
            self.route(f"{v1}/jobs/{{job_id}}", operations.get_job),
            self.route(f"{v1}/jobs/{{job_id}}/cancel", self.cancel_job, method="POST",
                       operate=True),
            self.route(f"{v1}/jobs/{{job_id}}/retry", self.retry_job, method="POST",
                       operate=True),
            self.route(f"{v1}/queues", self.list_queues),
            *[self.route(f"{v1}/queues/{{queue}}/{verb}", self.queue_verb(verb),
                         method="POST", operate=True) for verb in ("pause", "resume", "limit")],
            self.route(f"{v1}/drain", self.drain),
            self.route(f"{v1}/drain", self.drain, method="POST", operate=True),
            self.route(f"{v1}/functions", self.list_functions, query=FUNCTIONS_QUERY),
            self.route(f"{v1}/functions/{{name}}/trigger", self.trigger, method="POST",
                       operate=True), *operations.routes(self), *workflow_routes.routes(self),
            Mount("/static", ConsoleFiles(directory=static), name="static"),
        ]

        async def refused(request: Request, exc: Exception) -> Response:
            """Starlette's own refusals (no such route, a method a route does not take),
            answered like every other: ``{"error": ...}``."""
            assert isinstance(exc, HTTPException)
            return JSONResponse({"error": exc.detail}, exc.status_code,
                                {**(exc.headers or {}), **SECURITY_HEADERS})

        app = Starlette(routes=routes, exception_handlers={HTTPException: refused})
        app.router.redirect_slashes = False  # "/api/v1/jobs/" is no route: a 404, not a 307
        return app


class ConsoleFiles(StaticFiles):
    """The console's static files. A path no file can have (a NUL, which the operating
    system refuses with an error of its own) is a 404 like any other missing file."""

    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        if "\x00" in path:
            return "", None
        return super().lookup_path(path)


# -- input ---------------------------------------------------------------------------------


def _body(call: Call) -> dict[str, Any]:
    if not isinstance(call.body, dict):
        raise InvalidSpec("the body must be a JSON object")
    return call.body


def _reason(call: Call, verb: str) -> str:
    """The reason a write gives (the body's ``reason``), with who asked."""
    given = _body(call).get("reason") if call.body is not None else None
    if given is not None and not isinstance(given, str):
        raise InvalidSpec("reason must be text")
    if not verb:
        return (given or "")[:2000]
    said = f": {given[:2000]}" if given else ""
    return f"{verb} by {call.caller.user}{said}"
