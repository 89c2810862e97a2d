"""The execution of one claimed attempt: its actions in order under its guard, each
result recorded under the fence, and the fenced terminal write — or a give-back (retry,
timeout, SIGTERM), or nothing at all once the fence is lost. It returns what happened
(``Result``), with the claim of the next job when one rode on its terminal write; nothing
outside reaches into it while it runs.

A terminal write that the database refuses for a reason of its own (not its availability)
is replaced by a fenced ``failed`` naming that reason: a job whose work finished is never
left running for the sweeper to run again. After each action, whatever the action left
running — daemons included — is killed (``jobfence.worker.proctree``: this job's tree only,
when others run beside it).

A datum parent whose last child this attempt ended is finalized here, seconds after,
through the functions that answer this attempt about that parent only (``export-finalize``
retries what fails).
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from jobfence import tracing
from jobfence.actions import ActionContext, ActionFailed, AttemptSpace, Snooze, StopRequested
from jobfence.actions.child import ChildOutput
from jobfence.actions.installed import get_action
from jobfence.datums import AttemptFiles
from jobfence.durations import format_duration, parse_duration
from jobfence.errors import FenceLost, JobfenceError, NoFreeUid
from jobfence.finalize import finalize
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore
from jobfence.settings import Settings
from jobfence.store import ActionOutcome, Claim, RetryPolicy, TerminalWrite, Transition
from jobfence.worker.guard import GIVEN_BACK, Guard, StopReason
from jobfence.worker.guard_threads import Guards
from jobfence.worker.output import LineBudget, LogTarget, Origin, Output
from jobfence.worker.sandbox import Sandbox
from jobfence.worker.store_link import Finished, StoreLink, WriteRefused

log = get_logger("jobfence.worker")


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    RETRY = "retry"            # released back to pending, attempts remain
    FAILED = "failed"          # terminal failure
    SNOOZED = "snoozed"        # pending again after the delay an action asked for
    LOST = "lost"              # fence lost or self-fenced: wrote nothing
    GIVEN_BACK = "given_back"  # this worker could not run it (no free uid): pending again
    TERMINATED = "terminated"  # SIGTERM: given back by the guards


@dataclass(frozen=True, slots=True)
class Result:
    """What one execution did. Room to grow: what a later feature reports of a run (its
    usage, its log stream) belongs here, not in the loop."""

    claim: Claim
    outcome: Outcome
    next_claim: Claim | None = None
    """The job claimed in the same transaction as this one's terminal write: the slot's
    next execution."""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Next:
    """Whether a job is to follow this one in its slot (then its claim rides on this one's
    terminal write): ``want`` takes a place in the worker's budget, ``unwant`` gives it
    back when no job came."""

    want: Callable[[], bool] = lambda: False
    unwant: Callable[[], None] = lambda: None


@dataclass(frozen=True, slots=True)
class Wiring:
    """What every execution of a worker shares."""

    settings: Settings
    store_link: StoreLink
    guards: Guards
    sandbox: Sandbox
    objects: Callable[[], ObjectStore]
    installation: str
    retry: RetryPolicy
    lines: LineBudget | None = None
    """The worker's budget of output lines a second in its own log (None: none)."""


class Execution:
    """One claimed attempt, run once by ``run``."""

    def __init__(self, claim: Claim, wiring: Wiring, nxt: Next = Next()) -> None:
        self.claim = claim
        self.w = wiring
        self.nxt = nxt
        self.unconfirmed = threading.Event()  # a child of this attempt not known gone

    def run(self) -> Result:
        with tracing.attempt_span(self.w.store_link.read, self.claim,
                                  self.w.store_link.queue) as span:
            result = self._run()
            span.ended(result.outcome)
            return result

    def _run(self) -> Result:
        claim = self.claim
        log.info("job_claimed", job_id=str(claim.job_id), attempt_id=str(claim.attempt_id),
                  attempt=claim.attempt_count, max_attempts=claim.max_attempts)
        guard = self.w.guards.guard(claim)
        try:
            if guard.reason in GIVEN_BACK:  # SIGTERM came as the claim was made
                return Result(claim, Outcome.TERMINATED)
            space = AttemptSpace(lambda: self.w.sandbox.spaces.space(claim.attempt_id))
            try:
                try:
                    return self._run_actions(guard, space)
                except WriteRefused as exc:
                    return self._refused(guard, exc)
            finally:
                space.close()
        finally:
            self.w.guards.release(guard)

    # -- the actions -------------------------------------------------------------------------

    def _run_actions(self, guard: Guard, space: AttemptSpace) -> Result:
        claim, w = self.claim, self.w
        # A first attempt has nothing to resume; a retry skips what earlier ones finished.
        done: set[int] = set()
        if claim.may_resume:
            done = w.store_link.write(guard, lambda s: s.attempts.done_actions(
                claim.job_id, claim.attempt_id)) or set()
        todo = [i for i in range(len(claim.actions)) if i not in done]
        if done:
            log.info("resuming", job_id=str(claim.job_id), after_actions=sorted(done))
        if not todo:  # every action finished in an earlier attempt
            return self._finish(guard, None)
        env = {"JOBFENCE_JOB_ID": str(claim.job_id),
               "JOBFENCE_ATTEMPT_ID": str(claim.attempt_id)}
        files = AttemptFiles(job_id=claim.job_id, attempt_id=claim.attempt_id,
                             inputs=claim.inputs, objects=w.objects,
                             bucket=w.settings.s3_bucket, installation=w.installation,
                             write=lambda fn: w.store_link.write(guard, fn), touch=guard.touch)
        for index in todo:
            spec = claim.actions[index]
            started = datetime.now(UTC)
            log.debug("action_started", job_id=str(claim.job_id), index=index,
                      action=spec["name"])
            try:
                action = get_action(spec["name"])
                guard.begin_action(self._inactivity(spec))
                with tracing.action_span(index, spec["name"]):
                    ctx = ActionContext(job_id=claim.job_id, attempt_id=claim.attempt_id,
                                        action_index=index, space=space, stop=guard.stop,
                                        track_process=guard.track,
                                        untrack_process=guard.untrack, child_env=w.sandbox,
                                        files=files, env={**env, **tracing.child_env()},
                                        unconfirmed=self.unconfirmed,
                                        output=self._output(guard, index), touch=guard.touch)
                    try:
                        result = action.run(ctx, spec.get("params", {}))
                    finally:
                        guard.kill_tree(reap_children=True)  # its daemons and strays die
            except StopRequested:
                return self._stopped(guard, index, spec["name"], started)
            except FenceLost:
                if guard.stop.is_set():  # stopped meanwhile (an upload's write refused):
                    return self._stopped(guard, index, spec["name"], started)  # as it says
                return self._lost(guard)
            except NoFreeUid as exc:  # not the job's fault: another worker may run it now
                return self._give_back(guard, str(exc))
            except WriteRefused:
                raise
            except Snooze as asked:
                if guard.stop.is_set():
                    return self._stopped(guard, index, spec["name"], started)
                return self._snooze(guard, index, spec["name"], started, asked)
            except Exception as exc:
                if guard.stop.is_set():  # the child died because we killed it
                    return self._stopped(guard, index, spec["name"], started)
                failed = exc if isinstance(exc, ActionFailed) else None
                detail = failed.detail if failed else traceback.format_exc()
                outcome = ActionOutcome(index, spec["name"], False, started,
                                        result=failed.result if failed else None,
                                        error=str(exc) or type(exc).__name__,
                                        error_detail=detail)
                return self._fail(guard, outcome)
            if guard.stop.is_set():
                return self._stopped(guard, index, spec["name"], started)
            outcome = ActionOutcome(index, spec["name"], True, started,
                                    result=dict(result) if result else None)
            log.debug("action_succeeded", job_id=str(claim.job_id), index=index,
                      action=spec["name"])
            if index == todo[-1]:
                return self._finish(guard, outcome)
            if not self._record(guard, outcome):
                return self._lost(guard)
        raise AssertionError("unreachable: the last action finishes the job")

    def _inactivity(self, spec: dict[str, Any]) -> float | None:
        """How long the action may go without output or progress: its spec's, else the
        worker's setting."""
        given = spec.get("inactivity_timeout")
        if isinstance(given, str):
            with contextlib.suppress(ValueError):
                return parse_duration(given).total_seconds()
        quiet = self.w.settings.inactivity_timeout
        return quiet.total_seconds() if quiet is not None else None

    def _output(self, guard: Guard, index: int) -> Callable[[], ChildOutput]:
        """Where a child of action ``index`` writes: its tails, the worker's log and S3."""
        claim, w = self.claim, self.w
        target = None
        if w.settings.s3_bucket and w.settings.output_max_bytes:
            target = LogTarget(w.objects, w.settings.s3_bucket, w.installation,
                               w.settings.output_max_bytes,
                               lambda i: bool(w.store_link.write(guard, lambda s: (
                                   s.attempts.register_log(job_id=claim.job_id,
                                                           attempt_id=claim.attempt_id,
                                                           action_index=i)))))
        origin = Origin(claim.job_id, claim.attempt_id, claim.attempt_count, index)
        return lambda: Output(origin, lines=w.lines, target=target, touch=guard.touch)

    def _record(self, guard: Guard, outcome: ActionOutcome) -> bool:
        claim = self.claim
        return bool(self.w.store_link.write(guard, lambda s: s.attempts.record_action(
            job_id=claim.job_id, attempt_id=claim.attempt_id, outcome=outcome)))

    # -- how it ends -------------------------------------------------------------------------

    def _finish(self, guard: Guard, outcome: ActionOutcome | None) -> Result:
        claim = self.claim
        if not guard.lease_live() or guard.stop.is_set():
            return self._stopped_before_write(guard)
        guard.ending.set()
        wants = self.nxt.want()
        done = self.w.store_link.finish(
            guard, TerminalWrite(claim.job_id, claim.attempt_id, True, outcome), wants)
        if wants and done.next_claim is None:
            self.nxt.unwant()
        # A next claim's lease runs from now: guarded from now, not once this job's parent
        # is finalized (S3 I/O); handed on however this job ended; given back if it crashed.
        following = None if done.next_claim is None else self.w.guards.guard(done.next_claim)
        try:
            return replace(self._succeeded(guard, done), next_claim=done.next_claim)
        except BaseException:
            if following is not None:
                self.w.store_link.write(following, lambda s: s.attempts.interrupt_many(
                    [following.held], reason="given back: the job before it crashed",
                    max_interruptions=self.w.settings.max_interruptions), even_if_stopped=True)
                self.w.guards.release(following)
            raise

    def _succeeded(self, guard: Guard, done: Finished) -> Result:
        claim = self.claim  # the slot's next claim is handed on by _finish
        if done.refused is not None:
            return self._refused(guard, done.refused)
        if not done.written:
            return self._lost(guard)
        log.info("job_succeeded", job_id=str(claim.job_id), attempt_id=str(claim.attempt_id),
                 attempt=claim.attempt_count)
        self._finalize_parent()
        return Result(claim, Outcome.SUCCEEDED)

    def _give_back(self, guard: Guard, why: str) -> Result:
        """Give the job back, pending at once and its attempt not spent (as on SIGTERM, up
        to JOBFENCE_MAX_INTERRUPTIONS times): this worker cannot run it now."""
        claim = self.claim
        log.warning("job_given_back", job_id=str(claim.job_id), reason=why)
        guard.ending.set()
        back = self.w.store_link.write(guard, lambda s: s.attempts.interrupt_many(
            [(claim.job_id, claim.attempt_id)], reason=f"given back: {why}"[:2000],
            max_interruptions=self.w.settings.max_interruptions))
        if not back:
            return self._lost(guard)
        return Result(claim, Outcome.GIVEN_BACK, error=why)

    def _stopped_before_write(self, guard: Guard) -> Result:
        if guard.reason in GIVEN_BACK:
            return Result(self.claim, Outcome.TERMINATED)
        return self._lost(guard)

    def _fail(self, guard: Guard, outcome: ActionOutcome) -> Result:
        claim = self.claim
        log.warning("action_failed", job_id=str(claim.job_id), index=outcome.index,
                    action=outcome.name, error=outcome.error)
        reason = f"action {outcome.index + 1} ({outcome.name}) failed: {outcome.error}"
        guard.ending.set()
        t = self.w.store_link.write(guard, lambda s: s.attempts.release(
            job_id=claim.job_id, attempt_id=claim.attempt_id, reason=reason[:2000],
            retry=self.w.retry, outcome=outcome, error=outcome.error,
            error_detail=outcome.error_detail))
        return self._released(guard, t, outcome.error)

    def _snooze(self, guard: Guard, index: int, name: str, started: datetime,
                asked: Snooze) -> Result:
        """Give the job back until the delay has passed, the attempt not spent (what this
        attempt's earlier actions did stays recorded: the next claim resumes after them);
        or fail it once it has snoozed JOBFENCE_MAX_SNOOZES times. The snoozing action's
        output is recorded with it (``snoozed``), for ``status`` and ``logs``."""
        claim = self.claim
        reason = (f"snoozed for {format_duration(asked.delay)} by action {index + 1} "
                  f"({name})")
        log.info("job_snoozed", job_id=str(claim.job_id), index=index, action=name,
                 delay_seconds=asked.delay.total_seconds())
        guard.ending.set()
        t = self.w.store_link.write(guard, lambda s: s.attempts.snooze(
            job_id=claim.job_id, attempt_id=claim.attempt_id,
            delay_seconds=asked.delay.total_seconds(), reason=reason,
            max_snoozes=self.w.settings.max_snoozes,
            outcome=ActionOutcome(index, name, False, started, result=asked.result,
                                  snoozed=True)))
        if t is None or t.status != "pending":
            return self._released(guard, t, f"snoozed {self.w.settings.max_snoozes} times, "
                                                   "the most a job may")
        return Result(claim, Outcome.SNOOZED)

    def _stopped(self, guard: Guard, index: int, name: str, started: datetime) -> Result:
        claim = self.claim
        reason = guard.reason
        if reason in GIVEN_BACK:
            return Result(claim, Outcome.TERMINATED)
        if reason in (StopReason.TIMED_OUT, StopReason.INACTIVE):
            why = "timed out" if reason is StopReason.TIMED_OUT else "inactive"
            error = why
            if reason is StopReason.INACTIVE:
                quiet = timedelta(seconds=self._inactivity(claim.actions[index]) or 0)
                error = f"inactive: no output or progress for {format_duration(quiet)}"
            outcome = ActionOutcome(index, name, False, started, error=error)
            guard.ending.set()
            t = self.w.store_link.write(guard, lambda s: s.attempts.release(
                job_id=claim.job_id, attempt_id=claim.attempt_id, reason=why,
                retry=self.w.retry, outcome=outcome, error=error), even_if_stopped=True)
            return self._released(guard, t, error)
        return self._lost(guard)

    def _released(self, guard: Guard, t: Transition | None, error: str | None) -> Result:
        if t is None:
            return self._lost(guard)
        log.info("job_released", job_id=str(self.claim.job_id), status=t.status)
        if t.status == "failed":
            self._finalize_parent()
            return Result(self.claim, Outcome.FAILED, error=error)
        return Result(self.claim, Outcome.RETRY, error=error)

    def _refused(self, guard: Guard, exc: WriteRefused) -> Result:
        """A write of this attempt was refused: end the job ``failed`` with the reason,
        under the fence, without what could not be stored."""
        claim = self.claim
        error = f"the attempt's result could not be stored: {exc}"
        log.error("write_refused", job_id=str(claim.job_id), error=str(exc))
        guard.ending.set()
        try:
            t = self.w.store_link.write(guard, lambda s: s.attempts.finish(
                job_id=claim.job_id, attempt_id=claim.attempt_id, succeeded=False,
                reason=error, error=error))
        except WriteRefused as again:
            log.error("write_refused", job_id=str(claim.job_id), error=str(again),
                      message="the job stays running until its lease runs out")
            return Result(claim, Outcome.LOST, error=error)
        if t is None:
            return self._lost(guard)
        self._finalize_parent()
        return Result(claim, Outcome.FAILED, error=error)

    def _finalize_parent(self) -> None:
        """The parent of the child this attempt just ended, finalized if it was the last one
        (a parent's job is done when its last datum is), through the functions that answer
        this attempt about that parent only; a failure here is logged, and export-finalize
        finalizes it at its next pass."""
        claim = self.claim
        if claim.parent_id is None:
            return
        try:
            self.w.store_link.read(lambda s: finalize(
                s.parents.of_attempt(claim.job_id, claim.attempt_id), self.w.objects,
                self.w.settings.s3_bucket, self.w.installation))
        except JobfenceError as exc:
            log.warning("inline_finalize_failed", job_id=str(claim.parent_id), error=str(exc))

    def _lost(self, guard: Guard) -> Result:
        claim = self.claim
        if guard.reason is None:  # a write found the fence gone before the heartbeat did
            guard.request_stop(StopReason.FENCE_LOST)
            log.warning("writeback_stale_attempt", job_id=str(claim.job_id),
                        attempt_id=str(claim.attempt_id),
                        message="the fence was rotated: this attempt stops and writes nothing")
        if guard.reason in GIVEN_BACK:
            return Result(claim, Outcome.TERMINATED)
        self._confirm_stopped()
        return Result(claim, Outcome.LOST)

    def _confirm_stopped(self) -> None:
        """The attempt's actions have returned and every process they started is gone
        (killed and reaped, or confirmed by the command sidecar): say so, so that a
        cancelled job's resource is free and a timed-out one may run again now rather than
        when this attempt's lease ends. Written under this attempt's own id; nothing when
        the fence was not rotated while it ran, or a child's end is unknown."""
        claim = self.claim
        if self.unconfirmed.is_set():
            log.warning("stop_unconfirmed", job_id=str(claim.job_id),
                        message="a child's end could not be confirmed: the job waits for "
                                "this attempt's lease to end")
            return
        try:
            if self.w.store_link.read(lambda s: s.attempts.stopped(
                    job_id=claim.job_id, attempt_id=claim.attempt_id)):
                log.info("stop_confirmed", job_id=str(claim.job_id),
                         attempt_id=str(claim.attempt_id))
        except JobfenceError as exc:  # the lease bounds it: the sweeper lets it go then
            log.warning("stop_confirm_failed", job_id=str(claim.job_id), error=str(exc))
