"""Enqueueing, shared by the ``enqueue`` command and the Python API (``jobfence.api``): job
specs become rows, a spec with S3 ``inputs`` becomes a parent with one child per datum, and
everything goes to the store in one transaction (``Jobs.enqueue``), all or nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from jobfence import tracing
from jobfence.adapters import open_object_store
from jobfence.datums import child_batches
from jobfence.db import confirm_durable
from jobfence.errors import Conflict, NotFound, StoreUnavailable, Unavailable
from jobfence.ids import uuid7
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore, ObjectStoreError, output_bucket
from jobfence.settings import Settings
from jobfence.spec import JobSpec, seconds
from jobfence.store import Enqueued, NewJob, Store, Transition


def to_new_job(spec: JobSpec, settings: Settings) -> NewJob:
    parent = spec.inputs is not None
    return NewJob(
        is_parent=parent,
        inputs=spec.inputs.model_dump() if spec.inputs else None,
        job_id=uuid7(),
        actions=spec.stored_actions(),
        max_attempts=spec.max_attempts or settings.max_attempts,
        resource=spec.resource,
        priority=spec.priority,
        after=tuple(spec.after),
        labels=dict(spec.labels),
        ttl_seconds=seconds(spec.ttl),
        timeout_seconds=seconds(spec.timeout),
        expires_in_seconds=seconds(spec.expires_in),
        idempotency_key=spec.idempotency_key,
        spec_hash=spec.fingerprint() if spec.idempotency_key else None,
        queue=spec.queue,
        run_at=spec.run_at,
        delay_seconds=seconds(spec.delay),
    )


def submit(settings: Settings, store: Store, specs: Sequence[JobSpec], *,
           objects: Callable[[], ObjectStore] | None = None,
           list_first: bool = False, traceparent: str | None = None,
           reopen: Callable[[], Store] | None = None) -> list[Enqueued]:
    """Insert the jobs of ``specs``, in order. A parent's children come from the S3
    listing of its inputs: streamed batch by batch inside the transaction (memory bounded
    however many there are), or — ``list_first``, for a transaction the caller owns —
    listed whole before anything is written, so that the caller's transaction never waits
    on S3. The jobs carry the trace context of the enqueue (``jobfence.tracing``): its
    producer span's, a child of ``traceparent`` (the caller's W3C traceparent) or else of
    the current OpenTelemetry context.

    With ``reopen`` (a fresh connection to the writer), an enqueue whose outcome was lost
    with its connection (during its COMMIT, in a failover) is resolved, never doubled: the
    jobs' ids are made here, so a fresh connection reads whether they are there (then
    confirmed durable) and, if not, sends the same jobs again."""
    made = [to_new_job(spec, settings) for spec in specs]
    with tracing.enqueue_span(settings, made, traceparent) as jobs:
        try:
            return _insert(settings, store, jobs, objects, list_first)
        except StoreUnavailable as exc:
            if reopen is None:
                raise
            return _resolve(settings, reopen, jobs, objects=objects, list_first=list_first,
                            lost=exc)


RESOLVE_SECONDS = 60.0
"""How long an enqueue whose outcome was lost keeps trying to learn it (a failover is
typically well under a minute)."""


def _resolve(settings: Settings, reopen: Callable[[], Store], jobs: Sequence[NewJob], *,
             objects: Callable[[], ObjectStore] | None, list_first: bool,
             lost: StoreUnavailable) -> list[Enqueued]:
    """The enqueue of ``jobs`` was sent and its answer lost: on fresh connections, find
    whether it committed (one transaction: any of its jobs tells) and answer what is there,
    or send it again; StoreUnavailable (naming the jobs) when that cannot be learnt in
    RESOLVE_SECONDS."""
    log = get_logger("jobfence.enqueue")
    log.warning("enqueue_outcome_unknown", jobs=len(jobs), first_job=str(jobs[0].job_id),
                error=str(lost))
    until = time.monotonic() + RESOLVE_SECONDS
    while True:
        try:
            store = reopen()
            try:
                found = store.dependencies.status([j.job_id for j in jobs])
                if found:  # one transaction: it committed (a job replayed by its key aside)
                    confirm_durable(store.conn)
                    log.info("enqueue_outcome_resolved", committed=True, jobs=len(jobs))
                    keyed = store.jobs.by_idempotency_keys(
                        [j.idempotency_key for j in jobs
                         if j.job_id not in found and j.idempotency_key])
                    return [Enqueued(j.job_id, found[j.job_id]) if j.job_id in found
                            else Enqueued(keyed[j.idempotency_key or ""]["job_id"],
                                          keyed[j.idempotency_key or ""]["status"],
                                          created=False) for j in jobs]
                log.info("enqueue_outcome_resolved", committed=False, jobs=len(jobs))
                return _insert(settings, store, jobs, objects, list_first)
            finally:
                store.conn.close()
        except StoreUnavailable as exc:
            if time.monotonic() >= until:
                raise StoreUnavailable(
                    f"{exc}: the outcome of enqueueing job {jobs[0].job_id} (and the "
                    f"{len(jobs) - 1} sent with it) is unknown") from None
            log.warning("enqueue_retry", error=str(exc))
        except Conflict as exc:
            # the first try, still committing when read, committed under the second
            if "jobs_pkey" not in str(exc) or time.monotonic() >= until:
                raise
            time.sleep(0.5)


def _insert(settings: Settings, store: Store, jobs: Sequence[NewJob],
            objects: Callable[[], ObjectStore] | None, list_first: bool) -> list[Enqueued]:
    if not any(job.is_parent for job in jobs):
        return store.jobs.enqueue(jobs)
    output_bucket(settings)  # outputs and the manifest need a bucket: say so before listing
    opened = objects or (lambda: open_object_store(settings))

    def children(parent: NewJob) -> Iterator[list[NewJob]]:
        inputs = parent.inputs
        return child_batches(inputs["url"], inputs["per_datum"], opened())(parent)

    try:
        if list_first:
            listed = {job.job_id: list(children(job)) for job in jobs if job.is_parent}
            return store.jobs.enqueue(jobs, children=lambda job: iter(listed[job.job_id]))
        return store.jobs.enqueue(jobs, children=children)
    except ObjectStoreError as exc:
        if exc.code == "NoSuchBucket":
            raise NotFound(f"cannot list inputs: {exc}") from None
        raise Unavailable(f"cannot list inputs: {exc}") from None


def enqueued_object(job: Enqueued) -> dict[str, Any]:
    """What ``enqueue`` prints for a job (one JSON object per spec)."""
    out: dict[str, Any] = {"job_id": str(job.job_id), "status": job.status}
    if job.children is not None:
        out["children"] = job.children
    if not job.created:
        out["created"] = False
    return out


def cancelled_object(job_id: object, done: Sequence[Transition]) -> dict[str, Any]:
    """What ``cancel`` prints."""
    return {"job_id": str(job_id), "status": "cancelled",
            "children_cancelled": sum(1 for t in done if str(t.job_id) != str(job_id)
                                      and t.status == "cancelled")}
