"""Running one claimed attempt: its actions in order under the attempt's guard, each
result recorded under the fence, and the fenced terminal write — or a give-back (retry,
timeout, SIGTERM), or nothing at all once the fence is lost.

``AttemptRunner`` is the worker's engine; the worker (``jobfence.functions.worker``) adds
the claiming loop, SIGTERM and its report. A terminal write that the database refuses for a
reason of its own (not its availability) is replaced by a fenced ``failed`` naming that
reason: a job whose work finished is never left running for the sweeper to run again. The
worker process is the reaper of everything its jobs start (``jobfence.proctree``): after
each action, whatever the action left running — daemons included — is killed.

A worker reaches the store as the worker role (``jobfence.store.roles``): its fenced verbs
and nothing else. A datum parent whose last child this was is finalized by
``export-finalize`` at its next pass, not here: finalizing reads and writes other jobs.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import TypeVar

from jobfence import tracing  # tracing
from jobfence.actions import ActionContext, AttemptSpace, StopRequested, get_action
from jobfence.actions.builtin import ActionFailed
from jobfence.attempt import AttemptGuard, GuardThreads, SideChannel, StopReason
from jobfence.datums import AttemptFiles
from jobfence.db import Connection, connect
from jobfence.errors import ConfigError, FenceLost, JobfenceError, StoreUnavailable
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore
from jobfence.proctree import kill_descendants
from jobfence.sandbox import Sandbox
from jobfence.settings import Settings
from jobfence.store import ActionOutcome, Claim, RetryPolicy, Store, Transition
from jobfence.wiring import open_object_store

log = get_logger("jobfence.worker")
T = TypeVar("T")


class WriteRefused(Exception):
    """A fenced write failed for a reason of its own (a value the database would not take,
    a constraint): retrying it cannot help."""

    def __init__(self, cause: JobfenceError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    RETRY = "retry"            # released back to pending, attempts remain
    FAILED = "failed"          # terminal failure
    LOST = "lost"              # fence lost or self-fenced: wrote nothing
    TERMINATED = "terminated"  # SIGTERM: released by the watcher


class AttemptRunner:
    """One worker process's attempts, one after another, on one connection (plus the guard
    threads' side channel)."""

    def __init__(self, settings: Settings, queue: str) -> None:
        self.settings = settings
        self.queue = queue
        self.retry = RetryPolicy(settings.retry_base_seconds, settings.retry_max_seconds)
        try:
            self.sandbox = Sandbox.configured(settings.command_user, settings.command_uids,
                                              settings.command_env.split(","),
                                              settings.command_socket,
                                              settings.command_runner_uid)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.side = SideChannel(settings)
        self.guards = GuardThreads(join_timeout=settings.heartbeat + 6)
        self._conn = self._connect()
        # A worker of another installation stops here (exit 2), before it claims anything.
        identity = self.store.control.identity(settings.installation)
        assert identity.installation is not None
        self.installation: str = identity.installation
        self._lock = threading.Lock()
        self._current: AttemptGuard | None = None
        self.want_next: Callable[[], bool] = lambda: False
        """Asked at the terminal write: whether another job is to follow this one (then
        its claim rides on this write)."""
        self.next_claim: Claim | None = None
        self.terminating = False
        self._objects: ObjectStore | None = None
        self._unconfirmed = threading.Event()

    def objects(self) -> ObjectStore:
        """The object store, built on first use: a job without S3 never imports boto3."""
        if self._objects is None:
            self._objects = open_object_store(self.settings)
        return self._objects

    def _connect(self) -> Connection:
        conn = connect(self.settings.database_url, pooler=self.settings.database_pooler,
                       application_name="jobfence-worker",
                       connect_timeout=self.settings.connect_timeout_seconds)
        self.store = Store(conn, self.settings.schema_name)
        return conn

    def close(self) -> None:
        self.guards.close()  # its threads end before the connections they use
        self.side.close_quietly()
        self._conn.close()
        self.sandbox.close()

    def current_guard(self) -> AttemptGuard | None:
        """The attempt in hand (for the SIGTERM watcher), and from now on none may start."""
        with self._lock:
            self.terminating = True
            return self._current

    # -- one attempt -----------------------------------------------------------------------

    def run_attempt(self, claim: Claim) -> Outcome:
        with tracing.attempt_span(self.store, claim, self.queue) as span:  # tracing: attempt
            return span.ended(self._run_attempt(claim))  # tracing: how it ended

    def _run_attempt(self, claim: Claim) -> Outcome:
        log.debug("job_claimed", job_id=str(claim.job_id), attempt_id=str(claim.attempt_id),
                 attempt=claim.attempt_count, max_attempts=claim.max_attempts)
        guard = AttemptGuard(claim, self.settings, self.side, self.guards)
        with self._lock:
            self._current = guard
            terminating = self.terminating
        try:
            if terminating:  # SIGTERM arrived while the claim was being made
                guard.release_on_sigterm()
                return Outcome.TERMINATED
            space = AttemptSpace(lambda: self.sandbox.space(claim.attempt_id))
            try:
                with guard:
                    try:
                        return self._run_actions(claim, guard, space)
                    except WriteRefused as exc:
                        return self._refused(claim, guard, exc)
            finally:
                space.close()
        finally:
            with self._lock:
                self._current = None

    def _run_actions(self, claim: Claim, guard: AttemptGuard, space: AttemptSpace) -> Outcome:
        # A first attempt has nothing to resume; a retry skips what earlier ones finished.
        done = (self.store.attempts.done_actions(claim.job_id, claim.attempt_id)
                if claim.may_resume else set())
        todo = [i for i in range(len(claim.actions)) if i not in done]
        if done:
            log.info("resuming", job_id=str(claim.job_id), after_actions=sorted(done))
        if not todo:  # every action finished in an earlier attempt
            return self._finish(claim, guard, None)
        env = {"JOBFENCE_JOB_ID": str(claim.job_id), "JOBFENCE_ATTEMPT_ID": str(claim.attempt_id)}
        self._unconfirmed = threading.Event()  # a child of this attempt not known gone
        files = AttemptFiles(job_id=claim.job_id, attempt_id=claim.attempt_id,
                             inputs=claim.inputs, objects=self.objects,
                             bucket=self.settings.s3_bucket, installation=self.installation,
                             write=lambda fn: self._write(guard, fn))
        for index in todo:
            spec = claim.actions[index]
            started = datetime.now(UTC)
            log.debug("action_started", job_id=str(claim.job_id), index=index, action=spec["name"])
            try:
                action = get_action(spec["name"])
                with tracing.action_span(index, spec["name"]):  # tracing: the action's span
                    ctx = ActionContext(job_id=claim.job_id, attempt_id=claim.attempt_id,
                                        action_index=index, space=space, stop=guard.stop,
                                        track_process=guard.track,
                                        untrack_process=guard.untrack, files=files,
                                        env={**env, **tracing.child_env()},  # tracing
                                        sandbox=self.sandbox, unconfirmed=self._unconfirmed)
                    try:
                        result = action.run(ctx, spec.get("params", {}))
                    finally:
                        kill_descendants(reap_children=True)  # daemons and strays die with it
            except StopRequested:
                return self._stopped(claim, guard, index, spec["name"], started)
            except FenceLost:
                return self._lost(claim, guard)
            except WriteRefused:
                raise
            except Exception as exc:
                if guard.stop.is_set():  # the child died because we killed it
                    return self._stopped(claim, guard, index, spec["name"], started)
                failed = exc if isinstance(exc, ActionFailed) else None
                detail = failed.detail if failed else traceback.format_exc()
                outcome = ActionOutcome(index, spec["name"], False, started,
                                        result=failed.result if failed else None,
                                        error=str(exc) or type(exc).__name__,
                                        error_detail=detail)
                return self._fail(claim, guard, outcome)
            if guard.stop.is_set():
                return self._stopped(claim, guard, index, spec["name"], started)
            outcome = ActionOutcome(index, spec["name"], True, started,
                                    result=dict(result) if result else None)
            log.debug("action_succeeded", job_id=str(claim.job_id), index=index,
                     action=spec["name"])
            if index == todo[-1]:
                return self._finish(claim, guard, outcome)
            if not self._record(claim, guard, outcome):
                return self._lost(claim, guard)
        raise AssertionError("unreachable: the last action finishes the job")

    def _record(self, claim: Claim, guard: AttemptGuard, outcome: ActionOutcome) -> bool:
        return bool(self._write(guard, lambda s: s.attempts.record_action(
            job_id=claim.job_id, attempt_id=claim.attempt_id, outcome=outcome)))

    def _finish(self, claim: Claim, guard: AttemptGuard,
                outcome: ActionOutcome | None) -> Outcome:
        t: Transition | None = None
        combined = False
        if self.want_next() and not self.terminating and guard.lease_live() \
                and not guard.stop.is_set():
            try:
                t, self.next_claim = self.store.attempts.finish_and_claim(
                    job_id=claim.job_id, attempt_id=claim.attempt_id, outcome=outcome,
                    worker_id=self.settings.worker, lease_seconds=self.settings.lease_seconds,
                    queue=self.queue)
                combined = True
            except JobfenceError as exc:
                # Unavailable: whether it committed is unknown; refused: nothing committed.
                # Either way finish alone (fenced, so a repeat is harmless); a claim that did
                # commit is reclaimed when its lease runs out.
                log.warning("write_retry", error=str(exc))
        if not combined:
            t = self._write(guard, lambda s: s.attempts.finish(
                job_id=claim.job_id, attempt_id=claim.attempt_id, succeeded=True,
                outcome=outcome))
        if t is None and not self._won_anyway(claim, "succeeded"):
            return self._lost(claim, guard)
        log.info("job_succeeded", job_id=str(claim.job_id), attempt_id=str(claim.attempt_id),
                 attempt=claim.attempt_count)
        return Outcome.SUCCEEDED

    def _fail(self, claim: Claim, guard: AttemptGuard, outcome: ActionOutcome) -> Outcome:
        log.warning("action_failed", job_id=str(claim.job_id), index=outcome.index,
                    action=outcome.name, error=outcome.error)
        reason = f"action {outcome.index + 1} ({outcome.name}) failed: {outcome.error}"
        t = self._write(guard, lambda s: s.attempts.release(
            job_id=claim.job_id, attempt_id=claim.attempt_id, reason=reason[:2000],
            retry=self.retry, outcome=outcome, error=outcome.error,
            error_detail=outcome.error_detail))
        return self._released(claim, guard, t)

    def _stopped(self, claim: Claim, guard: AttemptGuard, index: int, name: str,
                 started: datetime) -> Outcome:
        reason = guard.reason
        if reason is StopReason.SIGTERM:
            return Outcome.TERMINATED
        if reason is StopReason.TIMED_OUT:
            error = "timed out"
            outcome = ActionOutcome(index, name, False, started, error=error)
            t = self._write(guard, lambda s: s.attempts.release(
                job_id=claim.job_id, attempt_id=claim.attempt_id, reason="timed out",
                retry=self.retry, outcome=outcome, error=error), even_if_stopped=True)
            return self._released(claim, guard, t)
        return self._lost(claim, guard)

    def _released(self, claim: Claim, guard: AttemptGuard, t: Transition | None) -> Outcome:
        if t is None:
            return self._lost(claim, guard)
        log.info("job_released", job_id=str(claim.job_id), status=t.status)
        if t.status == "failed":
            return Outcome.FAILED
        return Outcome.RETRY

    def _refused(self, claim: Claim, guard: AttemptGuard, exc: WriteRefused) -> Outcome:
        """A write of this attempt was refused: end the job ``failed`` with the reason,
        under the fence, without what could not be stored."""
        error = f"the attempt's result could not be stored: {exc}"
        log.error("write_refused", job_id=str(claim.job_id), error=str(exc))
        try:
            t = self._write(guard, lambda s: s.attempts.finish(
                job_id=claim.job_id, attempt_id=claim.attempt_id, succeeded=False,
                reason=error, error=error))
        except WriteRefused as again:
            log.error("write_refused", job_id=str(claim.job_id), error=str(again),
                      message="the job stays running until its lease runs out")
            return Outcome.LOST
        if t is None:
            return self._lost(claim, guard)
        return Outcome.FAILED

    def _lost(self, claim: Claim, guard: AttemptGuard) -> Outcome:
        if guard.reason is None:  # a write found the fence gone before the heartbeat did
            guard.request_stop(StopReason.FENCE_LOST)
            log.warning("writeback_stale_attempt", job_id=str(claim.job_id),
                        attempt_id=str(claim.attempt_id),
                        message="the fence was rotated: this attempt stops and writes nothing")
        self._confirm_stopped(claim)
        return Outcome.LOST

    def _confirm_stopped(self, claim: Claim) -> None:
        """The attempt's actions have returned and every process they started is gone
        (killed and reaped, or confirmed by the command sidecar): say so, so that a
        cancelled job's resource is free and a timed-out one may run again now rather than
        when this attempt's lease ends. Written under this attempt's own id; nothing when
        the fence was not rotated while it ran, or a child's end is unknown."""
        if self._unconfirmed.is_set():
            log.warning("stop_unconfirmed", job_id=str(claim.job_id),
                        message="a child's end could not be confirmed: the job waits for "
                                "this attempt's lease to end")
            return
        try:
            if self.store.attempts.stopped(job_id=claim.job_id, attempt_id=claim.attempt_id):
                log.info("stop_confirmed", job_id=str(claim.job_id),
                         attempt_id=str(claim.attempt_id))
        except JobfenceError as exc:  # the lease bounds it: the sweeper lets it go then
            log.warning("stop_confirm_failed", job_id=str(claim.job_id), error=str(exc))

    # -- fenced writes that survive a dropped connection -----------------------------------

    def _write(self, guard: AttemptGuard, fn: Callable[[Store], T],
               even_if_stopped: bool = False) -> T | None:
        """Run a fenced write while the lease is valid, reconnecting if the connection
        dropped. None when this attempt may not (or can no longer) write."""
        while True:
            if not guard.lease_live() or (guard.stop.is_set() and not even_if_stopped):
                return None
            try:
                return fn(self.store)
            except StoreUnavailable as exc:
                log.warning("write_retry", error=str(exc))
                if guard.stop.wait(0.2) and not even_if_stopped:
                    return None
                try:
                    self._conn.close()
                    self._conn = self._connect()
                except StoreUnavailable:
                    continue
            except JobfenceError as exc:
                raise WriteRefused(exc) from exc

    def _won_anyway(self, claim: Claim, status: str) -> bool:
        """After a retried terminal write matched nothing: had the first try committed?"""
        try:
            now = self.store.attempts.fence(claim.job_id, claim.attempt_id)
        except StoreUnavailable:
            return False
        return bool(now and now.status == status and now.holds)
