"""The OpenAPI 3.1 document of the API under ``/api/v1/`` (served at
``/api/v1/openapi.json``). A test checks that it names every route the server has, and only
those."""

from __future__ import annotations

from functools import cache
from typing import Any

from jobfence.version import version

_ERROR = {"$ref": "#/components/responses/Error"}


def _ok(description: str, schema: dict[str, Any], status: str = "200") -> dict[str, Any]:
    return {status: {"description": description,
                     "content": {"application/json": {"schema": schema}}}}


def _errors(*codes: str) -> dict[str, Any]:
    """Every route may answer 400 (a parameter it does not take, or a malformed one), 401
    and 403."""
    return {code: _ERROR for code in ("400", "401", "403", *codes)}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _op(summary: str, responses: dict[str, Any], *, operate: bool = False,
        params: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary + (" (operator)" if operate else ""),
                          "responses": responses}
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = {"required": False,
                             "content": {"application/json": {"schema": body}}}
    if operate:  # every write reads a body, if only to refuse it
        responses.setdefault("413", {
            "description": "the body is larger than 64 MiB (refused as it streams)",
            "content": {"application/json": {"schema": _ref("Error")}}})
    return op


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema or {"type": "string"}}


def _path(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string"}}


REASON = {"type": "object", "properties": {"reason": {"type": "string"}}}
TRACEPARENT = {"name": "traceparent", "in": "header", "required": False,
               "description": "the caller's W3C trace context: the jobs' enqueue joins its "
                              "trace (an invalid one is ignored)", "schema": {"type": "string"}}
JOB_ID = _path("job_id", "a job id (UUID)")
NEXT = {"type": ["string", "null"], "description": "where the rest is (a URL), or null"}
QUEUE = _path("queue", "a queue name (a DNS label)")


@cache
def document() -> dict[str, Any]:
    jobs_page = {"type": "object", "required": ["jobs", "next"],
                 "properties": {"jobs": {"type": "array", "items": _ref("Job")},
                                "next": {"type": ["string", "null"],
                                         "description": "the next page's URL, or null"}}}
    queue_out = _ok("the queue", _ref("Queue"))
    return {
        "openapi": "3.1.0",
        "info": {"title": "jobfence", "version": version(),
                 "description": "Fenced background jobs: jobs, queues, drain mode and the "
                                "periodic functions of one installation. Every request is "
                                "authenticated (JOBFENCE_AUTH); writes need an operator and "
                                "Content-Type: application/json."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/me": {"get": _op("who the caller is and what they may do",
                                      {**_ok("the caller", _ref("Caller")), **_errors()})},
            "/api/v1/jobs": {
                "get": _op("jobs, newest first, a page at a time: at most `limit` jobs and "
                           "4 MiB, each job at most 64 KiB (its actions past that by name "
                           "and status, `cut`, the rest at its `actions_next`)", {
                    **_ok("a page of jobs", jobs_page), **_errors("400")}, params=[
                    _query("status", "waiting, pending, running, succeeded, failed or "
                                     "cancelled"),
                    _query("queue", "a queue"), _query("resource", "a resource key"),
                    _query("label", "key=value[,key=value]: jobs carrying all of them"),
                    _query("parent", "a parent's job id: its children"),
                    _query("after", "a job id: the page after it (see next)"),
                    _query("limit", "jobs per page, 1-500 (50)", {"type": "integer"})]),
                "post": _op("submit one job spec or a list of them (all or nothing)", {
                    **_ok("what enqueue prints, per spec; Location names the first job",
                          {"oneOf": [_ref("Enqueued"),
                                     {"type": "array", "items": _ref("Enqueued")}]}, "202"),
                    **_errors("400", "404", "409", "503")}, operate=True, params=[TRACEPARENT],
                    body={"oneOf": [_ref("JobSpec"),
                                    {"type": "array", "items": _ref("JobSpec")}]}),
            },
            "/api/v1/jobs/{job_id}": {"get": _op(
                "one job with its actions' results, attempts and audit trail, at most 4 MiB: "
                "its newest events within 1 MiB (`events_omitted` the older), its actions "
                "whole while they fit, the rest by name and status (`cut`) and whole at "
                "`actions_next`",
                {**_ok("the job", _ref("Job")), **_errors("400", "404")}, params=[JOB_ID])},
            "/api/v1/jobs/{job_id}/cancel": {"post": _op(
                "cancel a job (a parent's unfinished children with it)",
                {**_ok("cancelled", {"type": "object"}), **_errors("400", "404", "409")},
                operate=True, params=[JOB_ID], body=REASON)},
            "/api/v1/jobs/{job_id}/retry": {"post": _op(
                "run a failed or cancelled job again, with a new attempt budget",
                {**_ok("pending again", {"type": "object"}),
                 **_errors("400", "404", "409", "503")},
                operate=True, params=[JOB_ID], body=REASON)},
            "/api/v1/queues": {"get": _op("every queue with jobs or settings", {
                **_ok("the queues", {"type": "object", "properties": {
                    "queues": {"type": "array", "items": _ref("Queue")}}}), **_errors()})},
            "/api/v1/queues/{queue}/pause": {"post": _op(
                "claim nothing from the queue", {**queue_out, **_errors("400")},
                operate=True, params=[QUEUE], body=REASON)},
            "/api/v1/queues/{queue}/resume": {"post": _op(
                "claim from the queue again", {**queue_out, **_errors("400")},
                operate=True, params=[QUEUE])},
            "/api/v1/queues/{queue}/limit": {"post": _op(
                "at most N running jobs of the queue (null: no limit)",
                {**queue_out, **_errors("400")}, operate=True, params=[QUEUE],
                body={"type": "object", "properties": {
                    "limit": {"type": ["integer", "null"], "minimum": 0}}})},
            "/api/v1/drain": {
                "get": _op("drain mode", {**_ok("drain mode", _ref("Drain")), **_errors()}),
                "post": _op("drain mode on or off", {
                    **_ok("drain mode", _ref("Drain")), **_errors("400")}, operate=True,
                    body={"type": "object", "required": ["on"], "properties": {
                        "on": {"type": "boolean"}, "reason": {"type": "string"}}}),
            },
            "/api/v1/functions": {"get": _op(
                "the periodic functions: last run, last success, health; recent runs and "
                "manual triggers", {**_ok("the functions", {"type": "object"}),
                                    **_errors("400")},
                params=[_query("runs", "recent runs to include, 0-200 (20)",
                               {"type": "integer"})])},
            "/api/v1/functions/{name}/trigger": {"post": _op(
                "run a periodic function now (a Job from its CronJob), recorded with who "
                "and why; at most once per interval per function",
                {**_ok("the trigger", _ref("Trigger"), "202"),
                 "429": {"description": "triggered too recently (Retry-After says when)",
                         "content": {"application/json": {"schema": _ref("Error")}}},
                 "502": {"description": "the cluster refused to start it (recorded)",
                         "content": {"application/json": {"schema": _ref("Error")}}},
                 "503": {"description": "this server has no cluster to start it in "
                                        "(JOBFENCE_CLUSTER=none); nothing recorded",
                         "content": {"application/json": {"schema": _ref("Error")}}},
                 **_errors("400", "404")},
                operate=True, params=[_path("name", "sweeper, reconciliation, lifecycle, "
                                                    "export-finalize or orphan-cleanup")],
                body={"type": "object", "required": ["reason"],
                      "properties": {"reason": {"type": "string"}}})},
            **more_paths(),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "JOBFENCE_AUTH=tokenreview: a "
                                           "Kubernetes token (TokenReview)"}},
            "responses": {"Error": {"description": "refused; the error says why",
                                    "content": {"application/json": {
                                        "schema": _ref("Error")}}}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"],
                          "properties": {"error": {"type": "string"}}},
                "Caller": {"type": "object", "properties": {
                    "user": {"type": "string"}, "groups": {"type": "array"},
                    "may_read": {"type": "boolean"}, "may_operate": {"type": "boolean"}}},
                "JobSpec": {"type": "object", "required": ["actions"],
                            "description": "docs/REFERENCE.md: a job spec, as `jobfence "
                                           "enqueue --spec` reads it"},
                "Enqueued": {"type": "object", "required": ["job_id", "status"],
                             "properties": {"job_id": {"type": "string", "format": "uuid"},
                                            "status": {"type": "string"},
                                            "children": {"type": "integer"},
                                            "created": {"type": "boolean"}}},
                "Job": {"type": "object", "description": "the `jobfence status -o json` "
                        "object; one job's page adds events and attempts",
                        "required": ["job_id", "status", "attempt_count", "max_attempts",
                                     "resource", "error", "created_at", "started_at",
                                     "finished_at", "queue", "run_at", "actions"]},
                "Queue": {"type": "object", "required": [
                    "queue", "paused", "limit", "pending", "scheduled", "running"]},
                "Drain": {"type": "object", "required": ["draining", "running"]},
                "Trigger": {"type": "object", "required": [
                    "trigger_id", "function", "requested_by", "reason", "requested_at",
                    "outcome", "job_name"]},
                "Bulk": {"type": "object", "required": ["verb", "dry_run", "matched",
                                                        "refused", "batches"],
                         "description": "what retry or cancel in bulk did: `retried` or "
                                        "`cancelled` (and `children_cancelled`), `refused` "
                                        "by why; a dry run's `job_ids` (at most 1,000)"},
                "Selection": {"type": "object", "description": "job_ids (at most 1,000), or "
                              "status (one or a list) with queue, resource, parent, label "
                              "({key: value} or key=value), before/after (RFC 3339, or an "
                              "ISO 8601 duration ago); limit (1000), dry_run, reason",
                              "properties": {
                                  "job_ids": {"type": "array", "items": {"type": "string"}},
                                  "status": {"oneOf": [{"type": "string"}, {
                                      "type": "array", "items": {"type": "string"}}]},
                                  "queue": {"type": "string"},
                                  "resource": {"type": "string"},
                                  "parent": {"type": "string"},
                                  "label": {"oneOf": [{"type": "string"},
                                                      {"type": "object"}]},
                                  "before": {"type": "string"}, "after": {"type": "string"},
                                  "limit": {"type": "integer", "minimum": 1},
                                  "dry_run": {"type": "boolean"},
                                  "reason": {"type": "string"}}},
                "Schedule": {"type": "object", "required": [
                    "name", "cron", "timezone", "paused", "next_tick_at", "spec"]},
            },
        },
    }


NAME = _path("name", "a schedule's name")
WORKFLOW = _path("workflow_id", "a workflow's id")


def more_paths() -> dict[str, Any]:
    """The routes of ``jobfence.console.operations``."""
    bulk = {**_ok("what was done (or, dry, would be)", _ref("Bulk")),
            **_errors("400", "409", "503")}
    schedule = _ok("the schedule", _ref("Schedule"))
    workflow = _ok("the workflow", {"type": "object", "required": ["workflow_id"]})
    groups = _ok("the groups", {"type": "object", "properties": {
        "queue": {"type": "string"}, "groups": {"type": "array", "items": {"type": "object"}}}})
    return {
        "/api/v1/jobs/retry": {"post": _op(
            "retry a selection of failed or cancelled jobs, a batch per transaction, each "
            "audited with the caller; 409 when more match than the limit", bulk,
            operate=True, body=_ref("Selection"))},
        "/api/v1/jobs/cancel": {"post": _op(
            "cancel a selection of waiting, pending or running jobs (a parent's children "
            "with it), a batch per transaction, each audited with the caller",
            {**_ok("what was done (or, dry, would be)", _ref("Bulk")),
             **_errors("400", "409")}, operate=True, body=_ref("Selection"))},
        "/api/v1/jobs/{job_id}/env": {"post": _op(
            "the values of a job's actions' env, recorded with who asked and why",
            {**_ok("each action's env", {"type": "object"}), **_errors("400", "404")},
            operate=True, params=[JOB_ID],
            body={"type": "object", "required": ["reason"],
                  "properties": {"reason": {"type": "string"}}})},
        "/api/v1/workflows": {
            "get": _op("workflows newest first, each with its status (running, succeeded, "
                       "failed with its `failed_step`, cancelled); `name`, `after` (a "
                       "workflow id: older ones), `limit` (1-500, 50)",
                       {**_ok("a page of workflows", {"type": "object", "properties": {
                           "workflows": {"type": "array", "items": {"type": "object"}},
                           "next": NEXT}}), **_errors("400")},
                       params=[_query("name", "a workflow's name"),
                               _query("after", "a workflow id"),
                               _query("limit", "1-500 (50)", {"type": "integer"})]),
            "post": _op("submit a workflow (`{\"workflow\", \"steps\": {STEP: JOB_SPEC}, "
                        "\"idempotency_key\"}`), validated whole and written in one "
                        "transaction: 201, its id and each step's job (200 when its key "
                        "answered an earlier one)", {**workflow, **_errors("400", "409")},
                        operate=True, body={"type": "object",
                                            "required": ["workflow", "steps"]}),
        },
        "/api/v1/workflows/{workflow_id}": {"get": _op(
            "a workflow, its status and each step's (job, status, after)",
            {**workflow, **_errors("400", "404")}, params=[WORKFLOW])},
        **{f"/api/v1/workflows/{{workflow_id}}/{verb}": {"post": _op(
            what, {**workflow, **_errors("400", "404", "409")}, operate=True,
            params=[WORKFLOW], body=REASON)}
           for verb, what in (("cancel", "cancel every unfinished step (a running one's "
                                         "command stopped through the cancel path)"),
                              ("retry", "run the failed and never-run steps again, the "
                                        "succeeded ones kept"))},
        "/api/v1/schedules": {
            "get": _op("schedules by name, a page at a time: at most `limit` and 4 MiB, each "
                       "at most 256 KiB (past it its spec's actions by name, `spec_cut`)",
                       {**_ok("a page of schedules", {
                           "type": "object", "required": ["schedules", "next"],
                           "properties": {
                               "schedules": {"type": "array", "items": _ref("Schedule")},
                               "next": NEXT}}),
                        **_errors("400")},
                       params=[_query("after", "a schedule's name: the page after it (see "
                                               "next)"),
                               _query("limit", "schedules per page, 1-500 (100)",
                                      {"type": "integer"})]),
            "post": _op("add a schedule: name, cron (five fields), timezone (UTC), spec",
                        {**_ok("the schedule", _ref("Schedule"), "201"),
                         **_errors("400", "409")}, operate=True,
                        body={"type": "object", "required": ["name", "cron", "spec"],
                              "properties": {"name": {"type": "string"},
                                             "cron": {"type": "string"},
                                             "timezone": {"type": "string"},
                                             "spec": _ref("JobSpec")}}),
        },
        "/api/v1/schedules/{name}": {"get": _op(
            "one schedule and its recent ticks, at most 4 MiB (past it, `spec_cut`: `jobfence "
            "schedule show NAME -o json` shows it whole)", {**schedule, **_errors("400", "404")},
            params=[NAME])},
        **{f"/api/v1/schedules/{{name}}/{verb}": {"post": _op(
            what, {**schedule, **_errors("400", "404")}, operate=True, params=[NAME])}
           for verb, what in (("pause", "enqueue nothing until resumed"),
                              ("resume", "enqueue again from the next tick after now"),
                              ("delete", "delete the schedule (its jobs stay)"))},
        "/api/v1/queues/{queue}/groups": {
            "get": _op("the queue's groups (tenants) with active jobs, the most active first "
                       "(at most 1,000): each one's pending, scheduled, running and waiting "
                       "jobs (`group` null: the jobs without one)", {**groups,
                                                                     **_errors("400")},
                       params=[QUEUE]),
            "post": _op("set the queue's limit on each group's running jobs (`group_limit`, "
                        "null: none) and/or its round-robin across groups (`fair`); the "
                        "groups", {**groups, **_errors("400")}, operate=True, params=[QUEUE],
                        body={"type": "object", "properties": {
                            "group_limit": {"type": ["integer", "null"], "minimum": 0},
                            "fair": {"type": "boolean"}}})},
        "/api/v1/queues/{queue}/history": {"get": _op(
            "per minute of the last `minutes` (60): jobs finished by status, claims, run "
            "time percentiles (p50, p95, p99) from the stored histograms",
            {**_ok("the minutes", {"type": "object"}), **_errors("400")},
            params=[QUEUE, _query("minutes", "1-1440 (60)", {"type": "integer"})])},
        "/api/v1/jobs/{job_id}/logs": {"get": _op(
            "an attempt's output, at most 1 MiB an answer: each stream of each action (whole "
            "on S3 where the worker put it there, else the tail kept in its result), from a "
            "place on (action, stream, offset in bytes), in order; `next` is where the rest "
            "starts (null: nothing more); `only=true` answers the one stream",
            {**_ok("the attempt's streams", {
                "type": "object", "required": ["job_id", "attempt", "running", "pieces",
                                               "next"],
                "properties": {"pieces": {"type": "array", "items": {"type": "object"}},
                               "next": NEXT}}), **_errors("400", "404")},
            params=[JOB_ID, _query("attempt", "the attempt's number (the latest)",
                                   {"type": "integer"}),
                    _query("action", "start at this action's output (from 0)",
                           {"type": "integer"}),
                    _query("stream", "start at this stream: stdout or stderr"),
                    _query("offset", "start this many bytes into it (0)", {"type": "integer"}),
                    _query("only", "true: that one stream only (false)")])},
        "/api/v1/jobs/{job_id}/actions": {"get": _op(
            "a job's actions whole, from `from` on, at most 4 MiB an answer (one alone "
            "larger comes by name and status, `cut`); `next` the rest",
            {**_ok("the actions", {
                "type": "object", "required": ["job_id", "actions", "next"],
                "properties": {"actions": {"type": "array", "items": {"type": "object"}},
                               "next": NEXT}}), **_errors("400", "404")},
            params=[JOB_ID, _query("from", "the first action's index (0)",
                                   {"type": "integer"})])},
    }
