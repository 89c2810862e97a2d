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

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar
from uuid import UUID

from shared.errors import JobfenceError
from shared.finalize import ZERO, finalize_parent
from shared.logs import get_logger
from shared.objectstore import ObjectStoreError, job_prefix
from shared.runner import Deps, run_pass
from shared.settings import Settings
from shared.store import RetentionCandidate, RetryPolicy, Transition

log = get_logger("jobfence.lifecycle")
T = TypeVar("T")

MAX_BATCHES = 200
"""Per step and pass. With the default batch of 500, one pass retires 100k jobs."""

DELETE_CHUNK = 1000
"""Keys per DeleteObjects call (S3's limit)."""

S3_THREADS = 8
"""Jobs whose objects are listed and deleted at once: S3 calls spend their time waiting, and
boto3's default pool holds 10 connections."""

S3_GIVE_UP = 50
"""Jobs in a row whose objects could not be deleted before the pass stops retention: the
object store is most likely down or refusing, and the next scheduled pass retries."""

FIRST = (datetime(1, 1, 1, tzinfo=UTC), ZERO)
"""The retention cursor before the first page."""


@dataclass(frozen=True, slots=True)
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
    function_runs_deleted: int
    batches: int
    longest_batch_seconds: float
    """Wall time of the longest single database batch: an upper bound on the longest
    transaction this pass held."""


class _Pass:
    """One lifecycle pass: the steps, and the counts they add up."""

    def __init__(self, settings: Settings, deps: Deps) -> None:
        self.settings, self.deps, self.store = settings, deps, deps.store
        self.batch_size = settings.batch_size
        self.bucket = settings.s3_bucket
        self.retry = RetryPolicy(settings.retry_base_seconds, settings.retry_max_seconds)
        self.timed_out_retried = self.timed_out_failed = self.expired = 0
        self.dependents_failed = self.parents_finalized = 0
        self.jobs_deleted = self.children_deleted = self.objects_deleted = 0
        self.failures = self.events_deleted = self.runs_deleted = 0
        self.batches = 0
        self.longest = 0.0
        self._budget = MAX_BATCHES
        self._pool: ThreadPoolExecutor | None = None
        self._failed_in_a_row = 0

    def report(self) -> Report:
        return Report(
            function="lifecycle",
            timed_out_retried=self.timed_out_retried, timed_out_failed=self.timed_out_failed,
            expired_cancelled=self.expired, dependents_failed=self.dependents_failed,
            parents_finalized=self.parents_finalized,
            retention_jobs_deleted=self.jobs_deleted,
            retention_children_deleted=self.children_deleted,
            retention_objects_deleted=self.objects_deleted,
            retention_failures=self.failures, events_deleted=self.events_deleted,
            function_runs_deleted=self.runs_deleted, batches=self.batches,
            longest_batch_seconds=round(self.longest, 4))

    # -- bounded batches -------------------------------------------------------------------

    def new_step(self) -> None:
        """Each step of the pass gets its own ``MAX_BATCHES``."""
        self._budget = MAX_BATCHES

    def budget_left(self) -> bool:
        return self._budget > 0

    def batch(self, verb: Callable[..., T], **kwargs: object) -> T:
        """Run one store verb that is one short database batch, against the budget."""
        self._budget -= 1
        return self.timed(verb, **kwargs)

    def timed(self, verb: Callable[..., T], **kwargs: object) -> T:
        """Run one store verb that is one short database batch, timed and counted."""
        self.batches += 1
        started = time.perf_counter()
        try:
            return verb(**kwargs)
        finally:
            self.longest = max(self.longest, time.perf_counter() - started)

    # -- 1. run timeouts -------------------------------------------------------------------

    def timeouts(self) -> None:
        self.new_step()
        while self.budget_left():
            done = self.batch(self.store.reclaim_timed_out, retry=self.retry,
                              batch_size=self.batch_size, now=self.deps.now)
            for t in done:
                log.warning("run_timed_out", job_id=str(t.job_id), status=t.status)
            self.timed_out_retried += sum(1 for t in done if t.status == "pending")
            self.timed_out_failed += sum(1 for t in done if t.status == "failed")
            self.settle(done)
            self.finalize_parents(done)
            if len(done) < self.batch_size:
                break

    def settle(self, done: Sequence[Transition]) -> None:
        moved = self.store.settle(done)
        self.dependents_failed += sum(1 for t in moved if t.terminal)

    def finalize_parents(self, done: Sequence[Transition]) -> None:
        """Finalize each parent one of whose children just became terminal, if it was the
        last; export-finalize retries whatever fails here."""
        parents = {t.parent_id for t in done if t.terminal and t.parent_id is not None}
        for parent_id in sorted(parents, key=str):
            try:
                t = finalize_parent(self.store, lambda: self.deps.objects, self.bucket,
                                    parent_id)
            except JobfenceError as exc:
                log.warning("inline_finalize_failed", job_id=str(parent_id), error=str(exc))
                continue
            if t is not None:
                self.parents_finalized += 1

    # -- 2. pending expiry -----------------------------------------------------------------

    def expiry(self) -> None:
        self.new_step()
        while self.budget_left():
            done, children = self.batch(self.store.expire_pending,
                                        batch_size=self.batch_size, now=self.deps.now)
            if done:
                log.info("expired_before_start", jobs=len(done), children=children,
                         first=str(done[0].job_id))
            self.expired += len(done) + children
            self.settle(done)
            if len(done) < self.batch_size:
                break

    # -- 3. retention ----------------------------------------------------------------------

    def retention(self) -> None:
        with ThreadPoolExecutor(S3_THREADS, thread_name_prefix="s3-delete") as pool:
            self._pool = pool
            for with_ttl in (True, False):
                self.new_step()
                if not self._retention_pages(with_ttl):
                    return

    def _retention_pages(self, with_ttl: bool) -> bool:
        """One kind of retention (ttl or default), page by page; False when the object
        store keeps failing and the pass should leave the rest to the next one."""
        store, cursor = self.store, FIRST
        while self.budget_left():
            page = self.batch(store.retention_due, with_ttl=with_ttl, after=cursor,
                              limit=self.batch_size,
                              default_retention=self.settings.retention_default,
                              now=self.deps.now)
            if not page:
                return True
            cleared = self._clear_objects(page)
            ready = [c.job_id for c in page if c.job_id in cleared
                     and (not c.is_parent or self._delete_children_rows(c.job_id))]
            if ready:  # even past the budget: their objects are gone, the rows go now
                gone = self.timed(store.delete_jobs, job_ids=ready)
                self.jobs_deleted += len(gone)
                log.info("retention_batch_deleted", jobs=len(gone),
                         kept=len(page) - len(gone))
            if self._failed_in_a_row >= S3_GIVE_UP:
                log.error("retention_stopped", failed_in_a_row=self._failed_in_a_row,
                          message="the object store keeps failing; the next pass retries")
                return False
            if len(page) < self.batch_size:
                return True
            cursor = (page[-1].due, page[-1].job_id)
        return True

    def _clear_objects(self, page: Sequence[RetentionCandidate]) -> set[UUID]:
        """Delete the objects of a page of jobs; the ids of those that own none any more.

        Only parents (their manifest, their children's outputs) and jobs that registered
        outputs can own objects; the others cost no S3 call. A job any of whose objects
        remain is logged and counted, and keeps every row until a later pass."""
        if not self.bucket:
            return {c.job_id for c in page}
        cleared = {c.job_id for c in page if not (c.is_parent or c.has_outputs)}
        plain = [c.job_id for c in page if c.has_outputs and not c.is_parent]
        outcomes: list[tuple[UUID, str | None]] = list(zip(plain, self._purge_all(plain),
                                                           strict=True))
        for c in page:
            if c.is_parent:
                error = self._purge_children(c.job_id) or self._purge_all([c.job_id])[0]
                outcomes.append((c.job_id, error))
        for job_id, error in outcomes:
            if error is None:
                cleared.add(job_id)
                self._failed_in_a_row = 0
            else:
                self.failures += 1
                self._failed_in_a_row += 1
                log.error("retention_objects_not_deleted", job_id=str(job_id), error=error,
                          message="rows kept; the next pass retries")
        return cleared

    def _purge_children(self, parent_id: UUID) -> str | None:
        """Delete the objects of every child of a parent, a page of children at a time;
        None, or why some remain."""
        after = ZERO
        while True:
            page = self.store.retention_children(parent_id=parent_id, after=after,
                                                 limit=self.batch_size)
            with_outputs = [child for child, has_outputs in page if has_outputs]
            for child, error in zip(with_outputs, self._purge_all(with_outputs), strict=True):
                if error is not None:
                    return f"child {child}: {error}"
            if len(page) < self.batch_size:
                return None
            after = page[-1][0]

    def _purge_all(self, job_ids: Sequence[UUID]) -> list[str | None]:
        """Delete everything under each job's prefix, ``S3_THREADS`` jobs at a time (S3
        calls are mostly waiting); per job, None or why some objects remain."""
        if not job_ids:
            return []
        assert self._pool is not None, "only during retention()"
        _ = self.deps.objects  # built here, once, before the threads share it
        results = list(self._pool.map(self._purge, [job_prefix(j) for j in job_ids]))
        self.objects_deleted += sum(n for n, _ in results)
        return [error for _, error in results]

    def _purge(self, prefix: str) -> tuple[int, str | None]:
        """Delete every object under ``prefix``, a listing page (≤ 1000 keys) at a time: how
        many went, and why some remain (None when none do). Runs on a pool thread, so it
        touches only the object store."""
        assert self.bucket is not None
        objects, deleted = self.deps.objects, 0
        try:
            for keys in _chunks((o.key for o in objects.iter_objects(self.bucket, prefix)),
                                DELETE_CHUNK):
                failed = objects.delete_many(self.bucket, keys)
                deleted += len(keys) - len(failed)
                if failed:
                    return deleted, (f"{len(failed)} of {len(keys)} objects not deleted, "
                                     f"first s3://{self.bucket}/{failed[0].key}: "
                                     f"{failed[0].error}")
        except ObjectStoreError as exc:
            return deleted, str(exc)
        return deleted, None

    def _delete_children_rows(self, parent_id: UUID) -> bool:
        while self.budget_left():
            n = self.batch(self.store.delete_children, parent_id=parent_id,
                           limit=self.batch_size)
            self.children_deleted += n
            if n < self.batch_size:
                return True
        return False  # out of batches: the next pass finishes this parent

    # -- 4. audit trail and function runs --------------------------------------------------

    def history(self) -> None:
        self.events_deleted += self._delete_old(self.store.delete_old_events,
                                                self.settings.audit_retention)
        self.runs_deleted += self._delete_old(self.store.delete_old_function_runs,
                                              self.settings.function_runs_retention)

    def _delete_old(self, verb: Callable[..., int], older_than: timedelta) -> int:
        self.new_step()
        total = 0
        while self.budget_left():
            n = self.batch(verb, older_than=older_than, limit=self.batch_size,
                           now=self.deps.now)
            total += n
            if n < self.batch_size:
                break
        return total


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def run_once(settings: Settings, deps: Deps) -> Report:
    p = _Pass(settings, deps)
    p.timeouts()
    p.expiry()
    p.retention()
    p.history()
    return p.report()


def main(argv: list[str] | None = None) -> int:
    return run_pass("lifecycle", sys.argv[1:] if argv is None else argv, run_once,
                    __doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
