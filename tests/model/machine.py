"""The stateful test of a job's life: hypothesis' ``RuleBasedStateMachine`` drives the real
store on a real PostgreSQL (a fresh database per sequence, from the tests' template) through
random sequences of the verbs the worker, the periodic passes and the operators' commands
call — several workers, a clock the test moves, resources, queue limits, datum parents — and
after every step compares the database with the reference model (``tests.model.life``) and
checks every invariant.

The clock: every deadline the store keeps is a timestamp compared with the database's
``now()``. Moving time forward by ``d`` is moving every timestamp the installation stores
back by ``d`` (``advance``): the database then sees what it would see ``d`` later. A model
tick is ``TICK`` seconds of that clock.

The workers are this driver: each step of a worker calls exactly the store verbs the
worker's own code calls at that point (``jobfence.worker.execution``: a claim; the actions
still to do from ``done_actions`` when the claim may resume; ``record_action``, the terminal
write through ``finish_many``, ``release``, ``snooze``, ``interrupt_many``; its guard's
``heartbeat_many`` and ``holding``; ``stopped`` once its attempt is over; the inline
finalization of a datum's parent). The periodic passes are the functions' own ``run_once``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar
from uuid import UUID

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)
from psycopg import sql

from bench.chaos_checks import CHECKS
from devtools.memory_objects import MemoryObjectStore
from devtools.sqlconn import connect
from jobfence import bulk
from jobfence.datums import child_batches
from jobfence.errors import JobAlreadyTerminal, NotRetryable, ResourceBusy
from jobfence.finalize import finalize
from jobfence.ids import uuid7
from jobfence.objectstore import attempt_prefix, s3_url
from jobfence.passes import export_finalize, lifecycle, orphan_cleanup, sweeper
from jobfence.passes.budget import Budget
from jobfence.passes.harness import Deps
from jobfence.settings import Settings
from jobfence.store import ActionOutcome, Claim, NewJob, Store, TerminalWrite
from jobfence.views import job_views
from tests.model.life import Life, Refused

TICK = 1000.0
"""Seconds of the database's clock in one model tick. A retry's backoff and a snooze last
between a quarter and a half of it; the real time one sequence takes must stay well under a
quarter (it takes a few seconds)."""
LEASE_TICKS = 2
MAX_SNOOZES = 3
BUCKET = "jobfence-model"
QUEUES = ("q1", "q2")
RESOURCES = ("r1", "r2")
WORKERS = ("w1", "w2", "w3")

# The audit checks of the chaos run that hold at any moment of a life with operators'
# retries in it (the others judge a finished run: every job terminal, one terminal
# transition each).
AUDIT_CHECKS = (
    "every move out of running names the claim that held the fence",
    "a succeeded job's result was written by its last claim",
    "no action result written outside its attempt's fence window",
    "no output registered or confirmed outside its attempt's fence window",
    "never two active jobs on one resource",
    "a finalized parent's counts match its children",
)

# Invariants judged from the database alone, at any moment.
INVARIANTS = {
    "at most one active job per resource, a stopping attempt counted (invariants 2, 12)": """
        SELECT resource, array_agg(job_id) AS jobs FROM jobs
        WHERE resource IS NOT NULL AND (status IN ('waiting', 'pending', 'running')
                                        OR stopping_until > now())
        GROUP BY resource HAVING count(*) > 1""",
    "attempt_count never exceeds max_attempts (invariant 4)": """
        SELECT job_id, attempt_count, max_attempts FROM jobs
        WHERE attempt_count > max_attempts""",
    "a job runs only after every dependency succeeded, whatever retried": """
        SELECT j.job_id, j.status, d.depends_on, dj.status AS dependency FROM jobs j
        JOIN job_dependencies d ON d.job_id = j.job_id
        JOIN jobs dj ON dj.job_id = d.depends_on
        WHERE j.status IN ('pending', 'running', 'succeeded') AND dj.status <> 'succeeded'""",
    "a job succeeded only if every action succeeded in its current run": """
        WITH run AS (
            SELECT j.job_id, j.actions, coalesce((SELECT max(e.event_id) FROM job_events e
                WHERE e.job_id = j.job_id AND e.from_status IN ('failed', 'cancelled')), 0)
                AS since
            FROM jobs j WHERE j.status = 'succeeded' AND NOT j.is_parent)
        SELECT run.job_id, i AS action_index FROM run
        CROSS JOIN LATERAL generate_series(0, jsonb_array_length(run.actions) - 1) i
        WHERE NOT EXISTS (
            SELECT 1 FROM job_action_results r JOIN job_events e
              ON e.job_id = r.job_id AND e.attempt_id = r.attempt_id
             AND e.to_status = 'running' AND e.event_id > run.since
            WHERE r.job_id = run.job_id AND r.action_index = i AND r.status = 'succeeded')""",
    "expires_in cancels only jobs that never started": """
        SELECT e.job_id, e.reason FROM job_events e
        WHERE e.to_status = 'cancelled' AND e.reason ILIKE '%expired%'
          AND EXISTS (SELECT 1 FROM job_events s WHERE s.job_id = e.job_id
                      AND s.to_status = 'running' AND s.attempt_id IS NOT NULL
                      AND s.event_id < e.event_id)""",
}

ALL_CHECKS = " UNION ALL ".join(
    f"(SELECT %s::text AS name, to_jsonb(x) AS found FROM ({q.strip().rstrip(';')}) x"
    " LIMIT 1)".replace("%s::text", "'" + name.replace("'", "''") + "'")
    for name, q in [*INVARIANTS.items(), *((n, CHECKS[n]) for n in AUDIT_CHECKS)])
"""Every check above in one statement: the first violation of each."""

# A queue's slots in use: running claims, and cancelled attempts still stopping.
OCCUPIED = """
SELECT count(*) FILTER (WHERE status = 'running' AND NOT is_parent)
     + count(*) FILTER (WHERE status <> 'running' AND stopping_until > now()) AS n
FROM jobs WHERE queue = %s"""


class Violation(AssertionError):
    """The store disagreed with the model, or broke an invariant."""


_KINDS: dict[str, type[Violation]] = {}


def violation(what: str) -> type[Violation]:
    """One class per kind of violation: hypothesis tells failures apart by their type, so
    one run shrinks and reports each kind it found on its own."""
    if what not in _KINDS:
        name = "".join(w.capitalize() for w in re.findall(r"[a-z]+", what.lower()))[:80]
        _KINDS[what] = type(name or "Violation", (Violation,), {})
    return _KINDS[what]


@dataclass
class Held:
    """What one worker holds: a claim, and the actions it still has to run (read at its
    first step, as the worker reads them before its first action)."""

    key: str
    attempt: str
    claim: Claim
    todo: list[int] | None = None


def _sql_of(conn: Any, query: str, *args: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(query, args or None).fetchall()]


class JobLife(RuleBasedStateMachine):
    """One installation's life, driven through the store and judged by the model."""

    jobs = Bundle("jobs")
    plain = Bundle("plain")
    """Top-level jobs that are not parents: what ``after`` may name."""

    url: str
    """The test's own database (fresh from the template); emptied before each sequence."""
    runs: ClassVar[dict[str, int]] = {"sequences": 0, "steps": 0, "jobs": 0}
    """What the machines of this process did, for the long run's report."""
    found: list[str]
    """Every violation raised in the run, shrunk or not (a run's own record of what it
    found, whatever hypothesis makes of it when it replays the failing sequence)."""

    def __init__(self) -> None:
        super().__init__()
        self.conn = connect(self.url)
        empty(self.conn)
        self.store = Store(self.conn)
        self.model = Life(lease=LEASE_TICKS, max_snoozes=MAX_SNOOZES)
        self.objects = MemoryObjectStore()
        self.settings = Settings(database_url=self.url, retry_base_seconds=TICK / 2,
                                 retry_max_seconds=TICK / 2, max_snoozes=MAX_SNOOZES,
                                 s3_bucket=BUCKET, batch_size=50)
        self.deps = Deps(self.store, self.settings, object_store=self.objects)
        self.installation = self.deps.installation
        self.ids: dict[str, UUID] = {}
        self.keys: dict[UUID, str] = {}
        self.attempts: dict[str, UUID] = {}
        self.held: dict[str, Held] = {}
        self.count = 0
        self.runs["sequences"] += 1

    def teardown(self) -> None:
        self.runs["jobs"] += len(self.model.jobs)
        self.conn.close()

    # -- helpers -----------------------------------------------------------------------------

    def _key(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def _name(self, job_id: UUID) -> str:
        return self.keys.get(job_id, str(job_id))

    def _fail(self, what: str, **detail: Any) -> None:
        message = f"{what}: " + ", ".join(f"{k}={v!r}" for k, v in detail.items())
        self.found.append(message)
        raise violation(what)(message)

    def _sql(self, query: str, *args: Any) -> list[dict[str, Any]]:
        return _sql_of(self.conn, query, *args)

    def _finalize_inline(self, key: str, attempt: str) -> None:
        """The worker's inline finalization of the parent of the child its attempt ended."""
        j = self.model.jobs[key]
        if j.parent is None:
            return
        t = finalize(self.store.parents.of_attempt(self.ids[key], self.attempts[attempt]),
                     lambda: self.objects, BUCKET, self.installation)
        if t is not None:
            if not self.model.finalize(j.parent):
                self._fail("a parent was finalized while a child is active", parent=j.parent)
        elif self.model.finalize(j.parent):
            self._fail("the worker ending a parent's last child did not finalize it",
                       parent=j.parent)

    def _release(self, worker: str) -> None:
        """The worker's attempt is over (refused, lost or given back): it has killed what it
        ran and says so (``stopped``), as the worker does after a lost fence."""
        h = self.held.pop(worker)
        confirmed = self.store.attempts.stopped(job_id=self.ids[h.key],
                                                attempt_id=self.attempts[h.attempt])
        expected = self.model.stopped(h.attempt)
        if expected == "yes" and not confirmed:
            self._fail("a stopping attempt's confirmation was refused", job=h.key)
        if expected == "no" and confirmed:
            self._fail("an attempt that was not stopping confirmed a stop", job=h.key)
        if expected == "either" and confirmed:
            self.model.let_go(h.attempt)

    # -- enqueue -------------------------------------------------------------------------------

    @rule(targets=(plain, jobs), queue=st.sampled_from(QUEUES),
          resource=st.none() | st.sampled_from(RESOURCES),
          outputs=st.lists(st.booleans(), min_size=1, max_size=3),
          max_attempts=st.integers(1, 3), after=st.lists(plain, max_size=2, unique=True),
          delay=st.integers(0, 2), expires=st.none() | st.integers(1, 2))
    def enqueue(self, queue: str, resource: str | None, outputs: list[bool],
                max_attempts: int, after: list[str], delay: int,
                expires: int | None) -> Any:
        expected = self.model.resource(resource)
        key = self._key("j")
        job = NewJob(job_id=uuid7(), actions=[{"name": "sleep", "params": {"seconds": 0}}
                                              for _ in outputs],
                     max_attempts=max_attempts, resource=resource, priority=-10 * self.count,
                     after=tuple(self.ids[a] for a in after), queue=queue,
                     delay_seconds=delay * TICK or None,
                     expires_in_seconds=None if expires is None else (delay + expires) * TICK)
        try:
            self.store.jobs.enqueue([job])
        except ResourceBusy:
            if expected == "free":
                self._fail("enqueue refused: resource busy, but no job holds it",
                           resource=resource)
            return multiple()
        if expected == "busy":
            self._fail("enqueue accepted on a resource an active or stopping job holds",
                       resource=resource)
        self.ids[key], self.keys[job.job_id] = job.job_id, key
        self.model.enqueue(key, queue=queue, resource=resource, actions=len(outputs),
                           outputs=tuple(outputs), max_attempts=max_attempts,
                           after=tuple(after), delay=delay,
                           expires_in=None if expires is None else delay + expires)
        return key

    @rule(target=jobs, queue=st.sampled_from(QUEUES), children=st.integers(1, 3),
          outputs=st.lists(st.booleans(), min_size=1, max_size=2),
          max_attempts=st.integers(1, 2))
    def enqueue_parent(self, queue: str, children: int, outputs: list[bool],
                       max_attempts: int) -> Any:
        key = self._key("p")
        prefix = f"in/{key}/"
        for i in range(children):
            self.objects.put_bytes(BUCKET, f"{prefix}{i}", b"x")
        url = s3_url(BUCKET, prefix)
        parent = NewJob(job_id=uuid7(), actions=[{"name": "sleep", "params": {"seconds": 0}}
                                                 for _ in outputs],
                        max_attempts=max_attempts, is_parent=True, queue=queue,
                        priority=-10 * self.count,
                        inputs={"url": url, "per_datum": 1})
        [made] = self.store.jobs.enqueue([parent], children=child_batches(
            url, 1, self.objects, batch_size=2))
        kids = [c.job_id for c in self.store.parents.children_page(
            parent_id=made.job_id, after=UUID(int=0), limit=children)]
        if len(kids) != children:
            self._fail("a parent's children were not all made", made=len(kids))
        # Every job of a sequence has a priority of its own, so that which ready job a
        # claim takes is the same in every run of the sequence (hypothesis replays it).
        # Children inherit their parent's: theirs are set apart here, as specs could.
        for i, kid in enumerate(kids):
            self.conn.execute("UPDATE jobs SET priority = %s WHERE job_id = %s",
                              (-10 * self.count - 1 - i, kid))
        names = [f"{key}.{i}" for i in range(children)]
        self.ids[key], self.keys[made.job_id] = made.job_id, key
        for n, k in zip(names, kids, strict=True):
            self.ids[n], self.keys[k] = k, n
        self.model.enqueue_parent(key, names, queue=queue, actions=len(outputs),
                                  outputs=tuple(outputs), max_attempts=max_attempts)
        return multiple(key, *names)

    # -- workers -------------------------------------------------------------------------------

    def _idle(self) -> list[str]:
        return [w for w in WORKERS if w not in self.held]

    @precondition(lambda self: len(self.held) < len(WORKERS))
    @rule(worker=st.sampled_from(WORKERS), queue=st.sampled_from((*QUEUES, None)))
    def claim(self, worker: str, queue: str | None) -> None:
        """A worker of ``queue`` claims a job (None: of a queue the model says has ready
        work, when one has)."""
        if worker in self.held:
            worker = self._idle()[0]
        if queue is None:
            queue = next((q for q in QUEUES if self.model.ready(q)), QUEUES[0])
        ready = self.model.ready(queue)
        claims = self.store.attempts.claim(worker_id=worker, lease_seconds=LEASE_TICKS * TICK,
                                           queue=queue, limit=1)
        if not claims:
            if ready:
                self._fail("a claim found nothing though jobs were ready", queue=queue,
                           ready=sorted(ready))
            return
        [c] = claims
        key = self.keys.get(c.job_id, str(c.job_id))
        if key not in ready:
            why = (self.model.why_not_ready(self.model.jobs[key])
                   if key in self.model.jobs else "unknown job")
            self._fail("a claim took a job that may not run now", job=key, why=why,
                       ready=sorted(ready))
        attempt = self.model.claim(key)
        self.attempts[attempt] = c.attempt_id
        self.held[worker] = Held(key, attempt, c)
        limit = self.model.queue(queue).limit
        [occupied] = self._sql(OCCUPIED, queue)
        if limit is not None and occupied["n"] > limit:
            self._fail("a claim exceeded its queue's limit (stopping attempts counted)",
                       queue=queue, limit=limit, occupied=occupied["n"])

    def _holding(self) -> list[str]:
        return [w for w in WORKERS if w in self.held]

    def _pick(self, worker: str) -> str:
        return worker if worker in self.held else self._holding()[0]

    @precondition(lambda self: bool(self.held))
    @rule(worker=st.sampled_from(WORKERS), check=st.sampled_from(["heartbeat", "holding"]))
    def guard(self, worker: str, check: str) -> None:
        """The worker's guard renews its lease (``heartbeat_many``), or asks whether its
        attempt still holds the fence (``holding``, the stop check); when not, the worker
        kills its command and confirms it gone."""
        worker = self._pick(worker)
        h = self.held[worker]
        held = [(self.ids[h.key], self.attempts[h.attempt])]
        if check == "heartbeat":
            answer = bool(self.store.attempts.heartbeat_many(held, LEASE_TICKS * TICK))
            expected = self.model.heartbeat(h.key, h.attempt)
        else:
            answer = bool(self.store.attempts.holding(held))
            expected = self.model.holds(h.key, h.attempt)
        if answer != expected:
            self._fail(f"{check} disagrees with the fence", job=h.key, store=answer,
                       model=expected)
        if not expected:
            self._release(worker)

    @precondition(lambda self: bool(self.held))
    @rule(worker=st.sampled_from(WORKERS),
          outcome=st.sampled_from(["ok", "ok", "ok", "fail", "snooze", "sigterm"]))
    def work(self, worker: str, outcome: str) -> None:
        """The worker's next step on its job: the next action succeeds (the last one
        finishes the job), fails, asks to snooze, or the worker gets SIGTERM."""
        worker = self._pick(worker)
        h = self.held[worker]
        job_id, attempt_id = self.ids[h.key], self.attempts[h.attempt]
        m = self.model
        if h.todo is None:
            done: set[int] = set()
            if h.claim.may_resume:
                done = self.store.attempts.done_actions(job_id, attempt_id)
            if m.holds(h.key, h.attempt):
                expected = set(m.jobs[h.key].done)
                if done != expected:
                    self._fail("a new attempt would resume after actions that did not "
                               "succeed in the job's current run (or redo ones that did)",
                               job=h.key, store_done=sorted(done), model_done=sorted(expected))
            h.todo = [i for i in range(m.jobs[h.key].actions) if i not in done]
        if outcome == "sigterm":
            back = self.store.attempts.interrupt_many([(job_id, attempt_id)],
                                                      reason="worker received SIGTERM",
                                                      max_interruptions=m.max_interruptions)
            self._agree("interrupt", h, bool(back), m.interrupt(h.key, h.attempt))
            self._release(worker)
            return
        if outcome == "snooze":
            t = self.store.attempts.snooze(job_id=job_id, attempt_id=attempt_id,
                                           delay_seconds=TICK / 2, reason="snoozed",
                                           max_snoozes=MAX_SNOOZES)
            self._agree("snooze", h, t is not None, m.snooze(h.key, h.attempt))
            if t is not None and t.status == "failed":
                self._finalize_inline(h.key, h.attempt)
            self._release(worker)
            return
        index = h.todo[0] if h.todo else None
        if outcome == "fail" and index is not None:
            out = ActionOutcome(index, "sleep", False, datetime.now(UTC), error="boom")
            t = self.store.attempts.release(job_id=job_id, attempt_id=attempt_id,
                                            reason="action failed", outcome=out, error="boom",
                                            retry=self.settings.retry_policy)
            self._agree("release", h, t is not None, m.fail(h.key, h.attempt))
            if t is not None and t.status == "failed":
                self._finalize_inline(h.key, h.attempt)
            self._release(worker)
            return
        result = self._output(h, index) if index is not None else None
        if result is False:
            self._agree("register_outputs", h, False, m.holds(h.key, h.attempt))
            self._release(worker)
            return
        out = (ActionOutcome(index, "sleep", True, datetime.now(UTC), result=result)
               if index is not None else None)
        if index is not None and len(h.todo) > 1:
            ok = self.store.attempts.record_action(job_id=job_id, attempt_id=attempt_id,
                                                   outcome=out)  # type: ignore[arg-type]
            self._agree("record_action", h, ok, m.record_action(h.key, h.attempt, index))
            if not ok:
                self._release(worker)
            else:
                h.todo.pop(0)
            return
        if m.holds(h.key, h.attempt):
            missing = set(range(m.jobs[h.key].actions)) - set(m.jobs[h.key].done) - {index}
            if missing:
                self._fail("the job would succeed though actions did not succeed in its "
                           "current run", job=h.key, missing=sorted(missing))
        written, _ = self.store.attempts.finish_many(
            [TerminalWrite(job_id, attempt_id, True, out)])
        self._agree("finish", h, job_id in written, m.finish(h.key, h.attempt, index))
        if job_id in written:
            self._finalize_inline(h.key, h.attempt)
            self.held.pop(worker)
        else:
            self._release(worker)

    def _output(self, h: Held, index: int) -> dict[str, Any] | bool | None:
        """An action that writes an output: registered under the fence, uploaded, confirmed
        (``jobfence.datums.publish_outputs``); False when the fence refused it."""
        if not self.model.jobs[h.key].outputs[index]:
            return None
        job_id, attempt_id = self.ids[h.key], self.attempts[h.attempt]
        path = f"out-{index}.txt"
        key = attempt_prefix(self.installation, job_id, attempt_id) + path
        url = s3_url(BUCKET, key)
        if not self.store.attempts.register_outputs(job_id=job_id, attempt_id=attempt_id,
                                                    outputs=[(path, url)]):
            return False
        self.objects.put_bytes(BUCKET, key, b"out")
        if not self.store.attempts.confirm_outputs(
                job_id=job_id, attempt_id=attempt_id,
                outputs=[{"path": path, "status": "done", "size_bytes": 3, "error": None}]):
            return False
        return {"outputs": [url]}

    def _agree(self, verb: str, h: Held, store: bool, model: bool) -> None:
        if store != model:
            self._fail(f"{verb} disagrees with the fence", job=h.key, store=store, model=model)

    # -- operators -----------------------------------------------------------------------------

    @rule(job=jobs)
    def cancel(self, job: str) -> None:
        try:
            expected: list[str] | None = self.model.cancel(job)
        except Refused:
            expected = None
        try:
            self.store.jobs.cancel(job_id=self.ids[job], reason="cancelled by operator")
        except JobAlreadyTerminal:
            if expected is not None:
                self._fail("cancel refused a job that has not finished", job=job)
            return
        if expected is None:
            self._fail("cancel accepted a finished job", job=job)

    def _retry_expectation(self, job: str) -> tuple[set[str], bool]:
        return self.model.retry_refusals(job)

    def _retried(self, job: str) -> None:
        allowed = self.model.retry(job)
        if len(allowed) > 1:
            [row] = self._sql("SELECT status FROM jobs WHERE job_id = %s", self.ids[job])
            if row["status"] not in allowed:
                self._fail("a retried job is in a state its dependencies do not allow",
                           job=job, status=row["status"], allowed=sorted(allowed))
            if row["status"] == "failed":
                self.model.settle_now(job)

    @rule(job=jobs)
    def retry(self, job: str) -> None:
        why, maybe_busy = self._retry_expectation(job)
        try:
            self.store.jobs.retry(job_id=self.ids[job], reason="retried by operator")
        except (NotRetryable, ResourceBusy) as exc:
            if not why and not (maybe_busy and isinstance(exc, ResourceBusy)):
                self._fail("retry refused a job the contract lets run again", job=job,
                           error=str(exc))
            return
        if why:
            self._fail("retry accepted a job the contract refuses", job=job, why=sorted(why))
        self._retried(job)

    @rule(selection=st.lists(jobs, min_size=1, max_size=4, unique=True))
    def bulk_retry(self, selection: list[str]) -> None:
        """``retry`` in bulk, as the CLI and the API run it (``jobfence.bulk.act``): each
        job by the one-job rules. Jobs of one selection that share a resource are left out
        (which one wins is not specified)."""
        seen: set[str] = set()
        chosen = []
        for k in selection:
            r = self.model.jobs[k].resource
            if r is None or r not in seen:
                chosen.append(k)
                if r is not None:
                    seen.add(r)
        expected = {k: self._retry_expectation(k) for k in chosen}
        before = self._trails()
        out = bulk.act(self.store, "retry", bulk.Selection(
            job_ids=tuple(self.ids[k] for k in chosen)), reason="retried by operator",
            limit=len(chosen), batch=len(chosen))
        after = self._trails()
        for k in chosen:
            why, maybe_busy = expected[k]
            retried = len(after.get(self.ids[k], [])) > len(before.get(self.ids[k], []))
            if retried and why:
                self._fail("bulk retry accepted a job the contract refuses", job=k,
                           why=sorted(why))
            if not retried and not why and not maybe_busy:
                self._fail("bulk retry refused a job the contract lets run again", job=k,
                           refused=dict(out.refused))
            if retried:
                self._retried(k)

    def _trails(self) -> dict[UUID, list[tuple[str | None, str]]]:
        trails: dict[UUID, list[tuple[str | None, str]]] = {}
        for e in self._sql("SELECT job_id, from_status, to_status FROM job_events"
                           " ORDER BY event_id"):
            trails.setdefault(e["job_id"], []).append((e["from_status"], e["to_status"]))
        return trails

    @rule(queue=st.sampled_from(QUEUES),
          setting=st.sampled_from(["pause", "resume", "no limit"]) | st.integers(0, 2))
    def configure(self, queue: str, setting: str | int) -> None:
        """``jobfence queue pause|resume|limit``."""
        if setting in ("pause", "resume"):
            self.store.queues.configure(queue, paused=setting == "pause", actor="model")
            self.model.queue(queue).paused = setting == "pause"
            return
        limit = None if setting == "no limit" else int(setting)
        self.store.queues.configure(queue, limit=limit, set_limit=True, actor="model")
        self.model.queue(queue).limit = limit

    # -- time and the periodic passes ------------------------------------------------------------

    @rule(ticks=st.integers(1, 2))
    def advance(self, ticks: int) -> None:
        """Time passes: every timestamp the installation keeps moves back."""
        shift_clock(self.conn, ticks * TICK)
        self.model.advance(ticks)

    @rule(function=st.sampled_from(["sweeper", "lifecycle", "export-finalize",
                                     "orphan-cleanup"]))
    def periodic(self, function: str) -> None:
        """One pass of a periodic function: its own ``run_once`` (lifecycle: its pending
        expiry — no job has a timeout, nothing is old enough for retention; orphan-cleanup:
        its object pass, every object past its grace)."""
        if function == "sweeper":
            sweeper.run_once(self.settings, self.deps)
            for parent in self.model.sweep():
                self.model.finalize(parent)
        elif function == "lifecycle":
            lifecycle.Expiry.run_once(self.settings, self.deps, Budget())
            self.model.expire()
        elif function == "export-finalize":
            export_finalize.run_once(self.settings, self.deps)
            self.model.export_finalize()
        else:
            report = orphan_cleanup.Report(function="orphan-cleanup", cluster="none")
            orphan_cleanup.clean_objects(self.store, self.objects, BUCKET, self.installation,
                                         cutoff=datetime.now(UTC).replace(year=9999),
                                         c=report)

    # -- judging -------------------------------------------------------------------------------

    @invariant()
    def judge(self) -> None:
        """After every step: the database agrees with the model, every invariant holds, and
        every output a succeeded job lists is kept."""
        self.runs["steps"] += 1
        self.agrees_with_the_model()
        self.invariants_hold()
        self.outputs_are_kept()

    def agrees_with_the_model(self) -> None:
        rows = {r["job_id"]: r for r in self._sql(
            "SELECT job_id, status, attempt_count, attempt_id, is_parent,"
            " coalesce(stopping_until > now(), false) AS stopping FROM jobs")}
        events = self._trails()
        for key, j in self.model.jobs.items():
            row = rows.get(self.ids[key])
            if row is None:
                self._fail("a job is gone", job=key)
            assert row is not None
            if row["status"] != j.status:
                self._fail("status differs from the model", job=key, store=row["status"],
                           model=j.status, why=self._why(key))
            if not j.is_parent and row["attempt_count"] != j.attempt_count:
                self._fail("attempt_count differs from the model", job=key,
                           store=row["attempt_count"], model=j.attempt_count)
            if j.status == "running" and not j.is_parent \
                    and row["attempt_id"] != self.attempts.get(j.attempt or ""):
                self._fail("another attempt holds the fence", job=key)
            if row["stopping"] != self.model.live_stopping(j):
                self._fail("stopping differs from the model", job=key, store=row["stopping"],
                           model=self.model.live_stopping(j))
            if events.get(self.ids[key], []) != j.trail:
                self._fail("the audit trail differs from the transitions (invariant 5)",
                           job=key, store=events.get(self.ids[key]), model=j.trail)

    def _why(self, key: str) -> str:
        j = self.model.jobs[key]
        return self.model.why_not_ready(j) or "ready"

    def invariants_hold(self) -> None:
        for r in self._sql(ALL_CHECKS):
            self._fail(r["name"], found=self._named(r["found"]))

    def outputs_are_kept(self) -> None:
        """Every output a succeeded job lists (as ``status`` shows it) is the one its current
        run made, is still in the object store, and is owned (orphan-cleanup keeps it)."""
        done = [k for k, j in self.model.jobs.items()
                if j.status == "succeeded" and not j.is_parent]
        if not done:
            return
        rows = self.store.jobs.page(limit=1000)
        views = {v["job_id"]: v for v in job_views(self.store, [
            r for r in rows if r.job_id in {self.ids[k] for k in done}])}
        for k in done:
            view = views[self.ids[k]]
            listed = {u for a in view["actions"] for u in
                      (a.get("result") or {}).get("outputs", [])}
            expected = {s3_url(BUCKET, attempt_prefix(self.installation, self.ids[k],
                                                      self.attempts[a]) + f"out-{i}.txt")
                        for i, a in self.model.outputs(k).items()}
            if listed != expected:
                self._fail("a succeeded job lists other outputs than its run made", job=k,
                           listed=sorted(listed), expected=sorted(expected))
            for url in listed:
                key = url.removeprefix(f"s3://{BUCKET}/")
                if (BUCKET, key) not in self.objects.objects:
                    self._fail("an output a succeeded job lists was deleted", job=k, url=url)
                owner = key.split("/")
                verdict = self.store.pods.object_owners([(UUID(owner[-3]), UUID(owner[-2]))])
                if set(verdict.values()) != {"keep"}:
                    self._fail("an output a succeeded job lists is not owned", job=k,
                               url=url, verdict=verdict)

    def _named(self, row: dict[str, Any]) -> dict[str, Any]:
        """A violation's row with job ids replaced by the sequence's names for them."""
        def name(v: Any) -> Any:
            if isinstance(v, list):
                return [name(x) for x in v]
            try:
                return self._name(UUID(str(v)))
            except ValueError:
                return v
        return {k: name(v) for k, v in row.items()}


KEPT = ("jobfence_control", "jobfence_schema_migrations")
"""What a sequence starts with: the installation's identity and its migrations."""


def empty(conn: Any) -> None:
    """The installation as a new one: no job, no queue setting, no history, no run. A
    TRUNCATE, not a DELETE: each sequence starts from empty heaps, so that rows the store
    cannot tell apart (a parent's children, same priority, same time) lie in the same order
    in every run of the sequence, and hypothesis replays it exactly."""
    tables = [r["table_name"] for r in _sql_of(conn, """
        SELECT table_name::text FROM information_schema.tables
        WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'""")
        if r["table_name"] not in KEPT]
    conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(map(sql.Identifier, tables))))


_SHIFT: dict[str, sql.Composed] = {}


def shift_clock(conn: Any, seconds: float) -> None:
    """Move the installation ``seconds`` into the future, as its database sees it: every
    timestamp stored in its schema moves back by that much (no job changes state, so the
    audit trail gains nothing)."""
    if not _SHIFT:
        for c in _sql_of(conn, """
                SELECT c.table_name::text, array_agg(c.column_name::text) AS cols
                FROM information_schema.columns c JOIN information_schema.tables t
                  ON t.table_schema = c.table_schema AND t.table_name = c.table_name
                WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
                  AND c.data_type = 'timestamp with time zone'
                GROUP BY c.table_name"""):
            _SHIFT[c["table_name"]] = sql.SQL("UPDATE {} SET {}").format(
                sql.Identifier(c["table_name"]), sql.SQL(", ").join(
                    sql.SQL("{col} = {col} - make_interval(secs => %(s)s)").format(
                        col=sql.Identifier(col)) for col in c["cols"]))
    with conn.transaction():
        for update in _SHIFT.values():
            conn.execute(update, {"s": seconds})


def seed_from_env() -> int | None:
    """``JOBFENCE_MODEL_SEED``: the seed of a run to reproduce."""
    raw = os.environ.get("JOBFENCE_MODEL_SEED")
    return int(raw) if raw else None
