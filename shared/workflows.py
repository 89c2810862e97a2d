"""Workflows: a graph of named steps submitted at once, each step a job spec.

``{"workflow": NAME, "steps": {STEP: JOB_SPEC, ...}, "idempotency_key": K}`` — a step's
``after`` names other steps (or job ids outside the workflow); a step with ``inputs`` fans
out into datums as any job does, and the steps after it wait for its parent. A step whose
``inputs`` are ``{"steps": [STEP, ...]}`` runs after those steps and gets their committed
outputs as its input files (``STEP/NAME``; a fan-out step's are its datums'), listed by
the database when it becomes pending (``jobfence_step_inputs``) — or, with ``per_datum``,
fans out over them: its datums made by the database when it starts. The whole is
validated before anything is written (every step as ``enqueue`` validates a spec; unknown
or duplicate names, a step after itself, a cycle, more than ``MAX_STEPS``: InvalidSpec)
and written in one transaction: the workflow's row, then its steps in dependency order,
each a job with ``workflow_id`` and ``step``. Its status is derived from its steps' jobs
(``jobfence_workflow_state``); cancel and retry act on its steps with the jobs' verbs.
"""

from __future__ import annotations

import graphlib
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple
from uuid import UUID

from jobfence import db, tracing
from jobfence.errors import Conflict, InvalidSpec, NotFound
from jobfence.ids import uuid7
from jobfence.limits import Unstorable, check_structure
from jobfence.objectstore import ObjectStore
from jobfence.settings import Settings
from jobfence.spec import Checking, JobSpec
from jobfence.store import Enqueued, NewJob, Store
from jobfence.store.workflows import StepRow, WorkflowRow
from jobfence.submit import datum_children, to_new_job

MAX_STEPS = 1000
"""The most steps one workflow may have (a fan-out step's datums are not steps)."""

NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,126}[A-Za-z0-9])?$")
STEP = re.compile(r"^[a-z0-9]([-a-z0-9_]{0,61}[a-z0-9])?$")
FIELDS = {"workflow", "steps", "idempotency_key"}


class Taken(NamedTuple):
    """A step's inputs from the steps before it: their files, to one job, or fanned out
    ``per_datum`` files a datum."""

    steps: tuple[str, ...]
    per_datum: int | None


class Workflow(NamedTuple):
    """A workflow spec, validated: its steps in an order where each comes after the steps
    it waits on."""

    name: str
    key: str | None
    steps: dict[str, JobSpec]
    after: dict[str, tuple[str, ...]]
    """Each step's steps before it (its spec's ``after`` keeps the job ids outside)."""
    inputs_from: dict[str, Taken]
    """The steps whose outputs a step takes as its inputs (each also in its ``after``)."""
    order: tuple[str, ...]
    spec_hash: str


def is_workflow(data: object) -> bool:
    return isinstance(data, Mapping) and "workflow" in data


def parse_workflow(data: object, where: str = "workflow") -> Workflow:
    """A workflow spec validated whole; InvalidSpec naming the first thing wrong."""
    try:
        check_structure(data)
    except Unstorable as exc:
        raise InvalidSpec(str(exc)) from None
    if not isinstance(data, Mapping):
        raise InvalidSpec(f"{where}: not an object")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise InvalidSpec(f"{where}: unknown field {str(unknown[0])[:60]!r} (a workflow has "
                          "workflow, steps and idempotency_key)")
    name, key, steps = data.get("workflow"), data.get("idempotency_key"), data.get("steps")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidSpec(f"{where}: workflow {str(name)[:70]!r} is not a name (1 to 128 "
                          "letters, digits and '-_.', starting and ending with one of the "
                          "first two)")
    if key is not None and not (isinstance(key, str) and 1 <= len(key) <= 500):
        raise InvalidSpec(f"{where}: idempotency_key must be text of 1 to 500 characters")
    if not isinstance(steps, Mapping) or not steps:
        raise InvalidSpec(f"{where}: steps must be an object of at least one named step")
    if len(steps) > MAX_STEPS:
        raise InvalidSpec(f"{where}: {len(steps)} steps; a workflow has at most {MAX_STEPS}")
    checking = Checking()
    specs: dict[str, JobSpec] = {}
    after: dict[str, tuple[str, ...]] = {}
    inputs_from: dict[str, Taken] = {}
    for step, body in steps.items():
        if not isinstance(step, str) or not STEP.fullmatch(step):
            raise InvalidSpec(f"{where}: step {str(step)[:70]!r} is not a step name (a DNS "
                              "label, '_' allowed: lower-case letters, digits, '-' and '_', "
                              "at most 63)")
        if not isinstance(body, Mapping):
            raise InvalidSpec(f"step {step}: not a job spec (an object)")
        if "idempotency_key" in body:
            raise InvalidSpec(f"step {step}: a step has no idempotency_key of its own (the "
                              "workflow's covers its steps)")
        names, jobs = _after(step, body.get("after"), steps)
        spec = {**body, "after": jobs}
        if taken := _inputs_from(step, body.get("inputs"), steps):
            del spec["inputs"]  # the files of the steps before it, listed when it is ready
            inputs_from[step] = taken
            names += tuple(s for s in taken.steps if s not in names)
        after[step] = names
        specs[step] = checking.spec(spec, f"step {step}", walked=True)
    checking.resources(list(specs.values()))
    try:
        order = tuple(graphlib.TopologicalSorter(after).static_order())
    except graphlib.CycleError as exc:
        cycle = list(exc.args[1])
        raise InvalidSpec(f"{where}: steps {' -> '.join(reversed(cycle))} form a cycle") \
            from None
    body = {k: v for k, v in data.items() if k != "idempotency_key"}
    spec_hash = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()
                               ).hexdigest()
    return Workflow(name, key, specs, after, inputs_from, order, spec_hash)


def _after(step: str, given: object, steps: Mapping[str, object]
           ) -> tuple[tuple[str, ...], list[str]]:
    """A step's ``after``: the steps it names, and the job ids (outside the workflow)."""
    if given is None:
        return (), []
    if not isinstance(given, list) or not all(isinstance(a, str) for a in given):
        raise InvalidSpec(f"step {step}: after must be a list of step names or job ids")
    names: list[str] = []
    jobs: list[str] = []
    for a in given:
        if a == step:
            raise InvalidSpec(f"step {step}: after itself")
        if a in steps:
            names.append(a)
            continue
        try:
            jobs.append(str(UUID(a)))
        except ValueError:
            raise InvalidSpec(f"step {step}: after {a[:70]!r}, which is neither a step of "
                              "the workflow nor a job id") from None
    if len(set(names)) != len(names):
        raise InvalidSpec(f"step {step}: a step named twice in its after")
    return tuple(names), jobs


def _inputs_from(step: str, given: object, steps: Mapping[str, object]) -> Taken | None:
    """The steps a step takes its inputs from (``{"steps": [...], "per_datum": N}``); None
    when its inputs are anything else (an s3:// url, checked with its spec)."""
    if not (isinstance(given, Mapping) and "steps" in given):
        return None
    if not set(given) <= {"steps", "per_datum"}:
        raise InvalidSpec(f"step {step}: inputs from steps take steps and per_datum only")
    per_datum = given.get("per_datum")
    if per_datum is not None and not (type(per_datum) is int and 1 <= per_datum <= 10_000):
        raise InvalidSpec(f"step {step}: inputs.per_datum must be a whole number from 1 to "
                          "10000")
    names = given["steps"]
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        raise InvalidSpec(f"step {step}: inputs.steps must be a list of step names")
    for n in names:
        if n == step:
            raise InvalidSpec(f"step {step}: takes its inputs from itself")
        if n not in steps:
            raise InvalidSpec(f"step {step}: inputs from {n[:70]!r}, which is not a step of "
                              "the workflow")
    if len(set(names)) != len(names):
        raise InvalidSpec(f"step {step}: a step named twice in its inputs")
    return Taken(tuple(names), per_datum)


class Submitted(NamedTuple):
    workflow_id: UUID
    name: str
    steps: dict[str, Enqueued]
    created: bool


def submit_workflow(settings: Settings, store: Store, workflow: Workflow, *,
                    actor: str | None, traceparent: str | None = None,
                    objects: Callable[[], ObjectStore] | None = None) -> Submitted:
    """Write ``workflow`` in one transaction: its row, then its steps in dependency order
    (a fan-out step's datums listed from S3 inside it, as an enqueue lists them). The same
    key and spec again: the first workflow answered (``created`` False); the key with
    another spec: Conflict. Every step carries the trace context of the submission: one
    trace spans the workflow."""
    workflow_id = uuid7()
    ids = {step: uuid7() for step in workflow.order}
    with tracing.enqueue_span(settings, traceparent) as traced:
        jobs = [_step_job(settings, workflow, workflow_id, ids, step,
                          traceparent=traced.traceparent) for step in workflow.order]
        traced.sent(jobs)
        with store.jobs.enqueuing() as adding:
            added = store.workflows.add(
                workflow_id=workflow_id, name=workflow.name, key=workflow.key,
                spec_hash=workflow.spec_hash, steps=len(jobs), actor=actor)
            if not added.created:
                if added.spec_hash != workflow.spec_hash:
                    raise Conflict(f"idempotency_key {workflow.key!r} was used for another "
                                   f"workflow ({added.workflow_id})")
                answers: list[Enqueued] = []
            else:
                answers = adding.add(jobs, datum_children(settings, objects))
        if not added.created:
            steps = store.workflows.steps([added.workflow_id])[added.workflow_id]
            return Submitted(added.workflow_id, workflow.name, {
                s.step: Enqueued(s.job_id, s.status, False) for s in steps}, False)
        if adding.owned:
            answers = store.jobs.settled_late(answers)
        by_id = {a.job_id: a for a in answers}
        return Submitted(workflow_id, workflow.name,
                         {step: by_id[ids[step]] for step in workflow.steps}, True)


def _step_job(settings: Settings, workflow: Workflow, workflow_id: UUID,
              ids: Mapping[str, UUID], step: str, *, traceparent: str | None) -> NewJob:
    spec = workflow.steps[step]
    job = to_new_job(spec, settings, ids[step], traceparent)
    after = tuple(ids[s] for s in workflow.after[step]) + job.after
    job = job._replace(after=after, workflow_id=str(workflow_id), step=step)
    if taken := workflow.inputs_from.get(step):
        inputs: dict[str, Any] = {"steps": {s: str(ids[s]) for s in taken.steps}}
        if taken.per_datum is not None:  # a parent whose datums are made when it starts
            inputs["per_datum"] = taken.per_datum
        job = job._replace(inputs=inputs, is_parent=taken.per_datum is not None)
    return job


def submitted_object(s: Submitted) -> dict[str, Any]:
    """What a workflow's enqueue answers: the workflow and each step's job."""
    out: dict[str, Any] = {"workflow_id": str(s.workflow_id), "workflow": s.name,
                           "steps": {step: {"job_id": str(e.job_id), "status": e.status}
                                     for step, e in s.steps.items()}}
    if not s.created:
        out["created"] = False
    return out


# -- reading, cancelling, retrying --------------------------------------------------------

def workflow_view(row: WorkflowRow, steps: Sequence[StepRow] | None = None) -> dict[str, Any]:
    """A workflow as the CLI, the API and the console show it (``-o json``)."""
    view: dict[str, Any] = {
        "workflow_id": str(row.workflow_id), "workflow": row.name, "status": row.status,
        "failed_step": row.failed_step, "steps_total": row.steps,
        "steps_succeeded": row.steps_done, "steps_failed": row.steps_failed,
        "idempotency_key": row.idempotency_key, "created_by": row.created_by,
        "created_at": row.created_at, "started_at": row.started_at,
        "finished_at": row.finished_at, "cancelled_at": row.cancelled_at}
    if steps is not None:
        depth: dict[str, int] = {}
        after = {s.step: s.after for s in steps}

        def deep(step: str) -> int:  # the steps in the order they may run
            if step not in depth:
                depth[step] = 0  # a cycle cannot be stored; this guards the recursion
                depth[step] = 1 + max((deep(a) for a in after[step] if a in after),
                                      default=-1)
            return depth[step]

        steps = sorted(steps, key=lambda s: (deep(s.step), s.step))
        view["steps"] = {s.step: {"job_id": str(s.job_id), "status": s.status,
                                  "after": list(s.after),
                                  "after_jobs": [str(j) for j in s.after_jobs],
                                  "fan_out": s.is_parent, "inputs_from": s.inputs_from,
                                  "inputs_handed": s.inputs_handed,
                                  "attempts": s.attempt_count,
                                  "reason": s.reason, "error": s.error,
                                  "started_at": s.started_at, "finished_at": s.finished_at}
                         for s in steps}
    return view


def views(store: Store, rows: Sequence[WorkflowRow]) -> list[dict[str, Any]]:
    """Each of these workflows as ``workflow_view`` shows it, their steps read at once."""
    steps = store.workflows.steps([r.workflow_id for r in rows])
    return [workflow_view(r, steps[r.workflow_id]) for r in rows]


def get(store: Store, workflow_id: UUID) -> tuple[WorkflowRow, list[StepRow]]:
    row = store.workflows.get(workflow_id)
    if row is None:
        raise NotFound(f"workflow {workflow_id} not found")
    return row, store.workflows.steps([workflow_id])[workflow_id]


def cancel(store: Store, workflow_id: UUID, *, actor: str | None, reason: str) -> int:
    """Mark the workflow cancelled and cancel its unfinished steps (a running step's command
    stopped through the cancel path; a fan-out step's datums with it), in one transaction;
    how many steps were cancelled."""
    _, steps = get(store, workflow_id)
    active = [s.job_id for s in steps if s.status in ("waiting", "pending", "running")]
    with db.transaction(store.conn):
        store.workflows.mark(workflow_id=workflow_id, cancelled=True, actor=actor,
                             reason=reason)
        done, _ = store.jobs.cancel_many(job_ids=active, reason=reason) if active else ([], [])
    return sum(1 for t in done if t.job_id in set(active))


def retry(store: Store, workflow_id: UUID, *, actor: str | None, reason: str
          ) -> dict[str, str]:
    """Run the workflow's failed and cancelled steps again — those that failed and those
    that never ran for them — with new attempts, the succeeded ones kept; each waits for
    the steps it is after again. A fan-out step runs its failed and cancelled datums again.
    Each retried step's status back, by name."""
    _, steps = get(store, workflow_id)
    again = [s for s in steps if s.status in ("failed", "cancelled")]
    with db.transaction(store.conn):
        store.workflows.mark(workflow_id=workflow_id, cancelled=False, actor=actor,
                             reason=reason)
        for s in again:
            if s.is_parent:
                store.parents.reopen(parent_id=s.job_id, reason=reason)
        acted = store.jobs.retry_many(job_ids=[s.job_id for s in again if not s.is_parent],
                                      reason=reason) if again else []
        refused = [a for a in acted if a.refusal is not None]
        if refused:  # all or nothing: the mark and every step rolled back with it
            step = next(s.step for s in again if s.job_id == refused[0].job_id)
            raise Conflict(f"step {step} cannot run again yet: {refused[0].refusal}")
    settled = {t.job_id: t.status for t in store.jobs.settle_retried(
        [s.job_id for s in again]).done}
    status = {a.job_id: a.status or "waiting" for a in acted}
    return {s.step: settled.get(s.job_id) or status.get(s.job_id) or "running" for s in again}
