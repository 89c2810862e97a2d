"""lifecycle: run timeouts, pending expiry, and retention of finished jobs, the audit trail
and function-run records. One pass, in that order:

1. **Run timeouts.** A running job past its ``timeout`` (``run_deadline_at``, set at the
   claim) has its fence rotated: back to pending with backoff while attempts remain (the
   timed-out attempt counts), else failed "timed out". Its worker finds out at its next
   heartbeat, kills its child and writes nothing more. Jobs waiting on one that failed are
   settled; a parent whose last active child timed out is finalized here, inline, as a
   worker would have done (export-finalize stays the safety net if that fails).
2. **Pending expiry.** A waiting or pending job past its ``expires_in`` is cancelled
   "expired before start" (a waiting parent's children with it); jobs waiting on it fail,
   naming it.
3. **Retention.** Top-level terminal jobs past their ``ttl`` (or, without one, finished
   longer ago than ``JOBFENCE_RETENTION_DEFAULT``): first their objects on S3 under
   ``jobfence/JOB_ID/`` (and each child's prefix), then their rows — children in batches,
   then the jobs, each batch its own short transaction. Job rows own the objects: if any
   object cannot be deleted, every row of that job stays and the next pass retries, so
   nothing is left pointing at nothing and nothing is left unowned. A job that never
   registered an output (and is not a parent, which owns its manifest) has nothing under its
   prefix, so it costs no S3 call; anything else found there is orphan-cleanup's.
4. **Audit trail and function runs**, each on its own retention, in bounded batches.

Bounded: every step pages in batches of ``JOBFENCE_BATCH_SIZE`` and stops after
``MAX_BATCHES`` batches (the next scheduled run carries on), so memory does not grow with
the tables and no transaction is long. Per-job S3 failures are logged and counted; the pass
still exits 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta

from jobfence.finalize import finalize_parents_of
from jobfence.logs import get_logger
from jobfence.passes.budget import Budget
from jobfence.passes.harness import Deps, snapshot
from jobfence.passes.retention import Retention
from jobfence.settings import Settings

log = get_logger("jobfence.lifecycle")


# -- 1. run timeouts -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimeoutsReport:
    timed_out_retried: int
    timed_out_failed: int
    dependents_failed: int
    parents_finalized: int


class Timeouts:
    """Running jobs past their run deadline: fence rotated, retried or failed."""

    @staticmethod
    def run_once(settings: Settings, deps: Deps, budget: Budget) -> TimeoutsReport:
        store = deps.store
        retried = failed = dependents_failed = finalized = 0
        for done, dependents in budget.pages(
                store.maintenance.reclaim_timed_out, size=settings.batch_size,
                count=lambda page: len(page[0]), retry=settings.retry_policy,
                batch_size=settings.batch_size, now=deps.now):
            for t in done:
                log.warning("run_timed_out", job_id=str(t.job_id), status=t.status)
            retried += sum(1 for t in done if t.status == "pending")
            failed += sum(1 for t in done if t.status == "failed")
            dependents_failed += sum(1 for t in dependents if t.terminal)
            finalized += finalize_parents_of(deps.store, lambda: deps.objects,
                                             settings.s3_bucket, deps.installation, done)
        return TimeoutsReport(timed_out_retried=retried, timed_out_failed=failed,
                              dependents_failed=dependents_failed, parents_finalized=finalized)


# -- 2. pending expiry -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExpiryReport:
    expired_cancelled: int
    dependents_failed: int


class Expiry:
    """Waiting or pending jobs past their ``expires_in``: cancelled before they start."""

    @staticmethod
    def run_once(settings: Settings, deps: Deps, budget: Budget) -> ExpiryReport:
        store = deps.store
        expired = dependents_failed = 0
        for (done, dependents), children in budget.pages(
                store.maintenance.expire_pending, size=settings.batch_size,
                count=lambda page: len(page[0][0]), batch_size=settings.batch_size,
                now=deps.now):
            if done:
                log.info("expired_before_start", jobs=len(done), children=children,
                         first=str(done[0].job_id))
            expired += len(done) + children
            dependents_failed += sum(1 for t in dependents if t.terminal)
        return ExpiryReport(expired_cancelled=expired, dependents_failed=dependents_failed)


# -- 4. history ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryReport:
    events_deleted: int
    control_events_deleted: int
    function_runs_deleted: int
    function_triggers_deleted: int
    schedule_ticks_deleted: int
    workflows_deleted: int


class History:
    """The audit trail (jobs' transitions, operators' changes), the function-run records
    with their manual triggers, and the workflows whose steps are gone, each on its own
    retention."""

    @staticmethod
    def run_once(settings: Settings, deps: Deps, budget: Budget) -> HistoryReport:
        m = deps.store.maintenance
        return HistoryReport(
            events_deleted=History._delete_old(m.delete_old_events, settings.audit_retention,
                                               settings, deps, budget),
            control_events_deleted=History._delete_old(
                m.delete_old_control_events, settings.audit_retention, settings, deps,
                budget),
            function_runs_deleted=History._delete_old(
                m.delete_old_function_runs, settings.function_runs_retention, settings, deps,
                budget),
            function_triggers_deleted=History._delete_old(
                m.delete_old_function_triggers, settings.function_runs_retention, settings,
                deps, budget),
            schedule_ticks_deleted=History._delete_old(
                m.delete_old_schedule_ticks, settings.function_runs_retention, settings,
                deps, budget),
            workflows_deleted=History._delete_old(
                m.delete_old_workflows, settings.audit_retention, settings, deps, budget))

    @staticmethod
    def _delete_old(verb: Callable[..., int], older_than: timedelta, settings: Settings,
                    deps: Deps, budget: Budget) -> int:
        return sum(budget.pages(verb, size=settings.batch_size, count=int,
                                older_than=older_than, limit=settings.batch_size,
                                now=deps.now))


# -- the pass ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    function: str
    timed_out_retried: int
    timed_out_failed: int
    expired_cancelled: int
    dependents_failed: int
    parents_finalized: int
    retention_jobs_deleted: int
    retention_children_deleted: int
    retention_objects_deleted: int
    retention_failures: int
    events_deleted: int
    control_events_deleted: int
    function_runs_deleted: int
    function_triggers_deleted: int
    schedule_ticks_deleted: int
    workflows_deleted: int
    batches: int
    longest_batch_seconds: float = snapshot()
    """Wall time of the longest single database batch: an upper bound on the longest
    transaction this pass held."""


def run_once(settings: Settings, deps: Deps) -> Report:
    budget = Budget(checkpoint=deps.checkpoint)
    timeouts = Timeouts.run_once(settings, deps, budget)
    expiry = Expiry.run_once(settings, deps, budget)
    retention = Retention.run_once(settings, deps, budget)
    history = History.run_once(settings, deps, budget)
    return Report(
        function="lifecycle",
        timed_out_retried=timeouts.timed_out_retried,
        timed_out_failed=timeouts.timed_out_failed,
        expired_cancelled=expiry.expired_cancelled,
        dependents_failed=timeouts.dependents_failed + expiry.dependents_failed,
        parents_finalized=timeouts.parents_finalized,
        **asdict(retention), **asdict(history),
        batches=budget.batches, longest_batch_seconds=round(budget.longest, 4))
