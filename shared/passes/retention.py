"""Retention of finished jobs: top-level terminal jobs past their ``ttl`` (or, without one,
finished longer ago than ``JOBFENCE_RETENTION_DEFAULT``) lose their objects on S3 first
(under ``jobfence/JOB_ID/`` and each child's prefix), then their rows — children in
batches, then the jobs, each batch its own short transaction.

Job rows own the objects: if any object cannot be deleted, every row of that job stays and
the next pass retries, so nothing is left pointing at nothing and nothing is left unowned.
A job that never registered an output (and is not a parent, which owns its manifest) has
nothing under its prefix, so it costs no S3 call; anything else found there is
orphan-cleanup's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from jobfence.errors import ObjectStoreError
from jobfence.ids import created_at
from jobfence.logs import get_logger
from jobfence.objectstore import job_prefix, legacy_job_prefix
from jobfence.passes.budget import Budget
from jobfence.passes.harness import Deps
from jobfence.settings import Settings
from jobfence.store import RetentionCandidate

log = get_logger("jobfence.passes.retention")

ZERO = UUID(int=0)

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
    retention_jobs_deleted: int
    retention_children_deleted: int
    retention_objects_deleted: int
    retention_failures: int


class Retention:
    """One retention pass; ``run_once`` is the service's entry."""

    def __init__(self, settings: Settings, deps: Deps, budget: Budget) -> None:
        self.settings, self.deps, self.budget = settings, deps, budget
        self.maintenance = deps.store.maintenance
        self.batch_size, self.bucket = settings.batch_size, settings.s3_bucket
        self.jobs_deleted = self.children_deleted = self.objects_deleted = 0
        self.failures = self._failed_in_a_row = 0
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def run_once(cls, settings: Settings, deps: Deps, budget: Budget | None = None) -> Report:
        return cls(settings, deps, budget or Budget(checkpoint=deps.checkpoint)).run()

    def run(self) -> Report:
        with ThreadPoolExecutor(S3_THREADS, thread_name_prefix="s3-delete") as pool:
            self._pool = pool
            for with_ttl in (True, False):
                self.budget.new_step()
                if not self._pages(with_ttl):
                    break
        return Report(retention_jobs_deleted=self.jobs_deleted,
                      retention_children_deleted=self.children_deleted,
                      retention_objects_deleted=self.objects_deleted,
                      retention_failures=self.failures)

    def _due(self, with_ttl: bool, cursor: tuple[datetime, UUID]) -> list[RetentionCandidate]:
        if with_ttl:
            return self.budget.batch(self.maintenance.retention_due_with_ttl, after=cursor,
                                     limit=self.batch_size, now=self.deps.now)
        return self.budget.batch(self.maintenance.retention_due_without_ttl, after=cursor,
                                 limit=self.batch_size, now=self.deps.now,
                                 default_retention=self.settings.retention_default)

    def _pages(self, with_ttl: bool) -> bool:
        """One kind of retention (ttl or default), page by page; False when the object
        store keeps failing and the pass should leave the rest to the next one."""
        cursor = FIRST
        while self.budget:
            page = self._due(with_ttl, cursor)
            if not page:
                return True
            cleared = self._clear_objects(page)
            ready = [c.job_id for c in page if c.job_id in cleared
                     and (not c.is_parent or self._delete_children_rows(c.job_id))]
            if ready:  # even past the budget: their objects are gone, the rows go now
                gone = self.budget.timed(self.maintenance.delete_jobs, job_ids=ready,
                                         default_retention=self.settings.retention_default,
                                         now=self.deps.now)
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
            page = self.maintenance.retention_children(parent_id=parent_id, after=after,
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
        assert self._pool is not None, "only during run()"
        _ = self.deps.objects  # built here, once, before the threads share it
        results = list(self._pool.map(self._purge_job, job_ids))
        self.objects_deleted += sum(n for n, _ in results)
        return [error for _, error in results]

    def _purge_job(self, job_id: UUID) -> tuple[int, str | None]:
        """Everything a job owns: under the installation's prefix, and for a job made
        before the installation had an identity, under the prefix releases before it
        used (the job's id, time-ordered, says when it was made)."""
        deleted, error = self._purge(job_prefix(self.deps.installation, job_id))
        if error is None and job_id.version == 7 and created_at(job_id) < self.deps.identified_at:
            more, error = self._purge(legacy_job_prefix(job_id))
            deleted += more
        return deleted, error

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
        n = self.batch_size  # no batch left at all: not finished
        for n in self.budget.pages(self.maintenance.delete_children, size=self.batch_size,
                                   count=int, new_step=False, parent_id=parent_id,
                                   limit=self.batch_size):
            self.children_deleted += n
        return n < self.batch_size  # else out of batches: the next pass finishes this parent


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
