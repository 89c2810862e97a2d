"""The API's workflows: submit one (``POST /api/v1/workflows``, the ``enqueue --spec``
workflow object), list them newest first, read one with its steps, cancel or retry it —
the CLI's ``workflow`` verbs, each audited with the caller."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.routing import Route

from jobfence import workflows
from jobfence.console import params
from jobfence.console.calls import Answer, Call, Routes
from jobfence.errors import InvalidSpec
from jobfence.store import Store

V1 = "/api/v1"
LIST_QUERY = {"name": params.Param(params.text_of("name", 128), None),
              "after": params.Param(params.workflow_id, None),
              "limit": params.Param(params.whole("limit", 1, 500), 50)}


def _reason(call: Call, verb: str) -> str:
    body = call.body if isinstance(call.body, dict) else {}
    given = body.get("reason")
    if given is not None and not isinstance(given, str):
        raise InvalidSpec("reason must be text")
    return f"workflow {verb}: {(given or 'from the API')[:2000]} (by {call.caller.user})"


def routes(server: Routes) -> list[Route]:
    def submit(store: Store, call: Call) -> Answer:
        done = workflows.submit_workflow(server.settings, store,
                                         workflows.parse_workflow(call.body),
                                         actor=call.caller.user,
                                         traceparent=call.traceparent)
        server.log.info("workflow_submitted", by=call.caller.user,
                        workflow_id=str(done.workflow_id), steps=len(done.steps))
        return Answer(workflows.submitted_object(done), 201 if done.created else 200,
                      {"location": f"{V1}/workflows/{done.workflow_id}"})

    def listing(store: Store, call: Call) -> Answer:
        q = call.params
        rows = store.workflows.page(name=q["name"], limit=q["limit"], after=q["after"])
        following = None
        if len(rows) == q["limit"]:
            given = {k: v for k, v in call.given.items() if k != "after"}
            following = f"{V1}/workflows?{urlencode({**given, 'after': str(rows[-1][0])})}"
        return Answer({"workflows": workflows.views(store, rows), "next": following})

    def one(store: Store, call: Call) -> Answer:
        return Answer(workflows.workflow_view(*workflows.get(store, call.path["workflow_id"])))

    def act(verb: str) -> Any:
        def handler(store: Store, call: Call) -> Answer:
            workflow_id = call.path["workflow_id"]
            if verb == "cancel":
                workflows.cancel(store, workflow_id, actor=call.caller.user,
                                 reason=_reason(call, "cancelled"))
            else:
                workflows.retry(store, workflow_id, actor=call.caller.user,
                                reason=_reason(call, "retried"))
            return Answer(workflows.workflow_view(*workflows.get(store, workflow_id)))
        return handler

    r = server.route
    return [
        r(f"{V1}/workflows", listing, query=LIST_QUERY),
        r(f"{V1}/workflows", submit, method="POST", operate=True),
        r(f"{V1}/workflows/{{workflow_id}}", one),
        *[r(f"{V1}/workflows/{{workflow_id}}/{verb}", act(verb), method="POST", operate=True)
          for verb in ("cancel", "retry")],
    ]
