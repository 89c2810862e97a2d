"""Enqueueing, shared by the ``enqueue`` command and the Python API (``jobfence.api``): job
specs become rows, a spec with S3 ``inputs`` becomes a parent with one child per datum, and
everything goes to the store in one transaction (``Jobs.enqueue``), all or nothing."""

from __future__ import annotations

import json
import os
import pickle
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any, TypeVar, cast
from uuid import UUID

from jobfence import tracing
from jobfence.adapters import open_object_store
from jobfence.datums import child_batches
from jobfence.db import confirm_durable
from jobfence.errors import ConfigError, Conflict, NotFound, StoreUnavailable, Unavailable
from jobfence.ids import uuid7s
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore, ObjectStoreError, output_bucket
from jobfence.settings import Settings
from jobfence.spec import JobSpec, seconds
from jobfence.store import Enqueued, NewJob, Store, Transition
from jobfence.store.types import ChildBatches

T = TypeVar("T")


def to_new_jobs(specs: Sequence[JobSpec], settings: Settings,
                traceparent: str | None = None) -> list[NewJob]:
    return [to_new_job(spec, settings, job_id, traceparent)
            for spec, job_id in zip(specs, uuid7s(len(specs)), strict=True)]


def to_new_job(spec: JobSpec, settings: Settings, job_id: UUID,
               traceparent: str | None = None) -> NewJob:
    parent = spec.inputs is not None
    return NewJob(
        is_parent=parent,
        inputs=spec.inputs.model_dump() if spec.inputs else None,
        job_id=job_id,
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
        group_key=spec.group,
        run_at=spec.run_at,
        delay_seconds=seconds(spec.delay),
        traceparent=traceparent,
    )


def submit(settings: Settings, store: Store, specs: Sequence[JobSpec], *,
           objects: Callable[[], ObjectStore] | None = None,
           list_first: bool = False, traceparent: str | None = None,
           reopen: Callable[[], Store] | None = None) -> list[Enqueued]:
    """Insert the jobs of ``specs``, in order, in one transaction, all or nothing. A
    parent's children come from the S3 listing of its inputs: streamed batch by batch
    inside the transaction (memory bounded however many there are), or — ``list_first``,
    for a transaction the caller owns — listed whole before anything is written, so that
    the caller's transaction never waits on S3. The jobs carry the trace context of the
    enqueue (``jobfence.tracing``): its producer span's, a child of ``traceparent`` (the
    caller's W3C traceparent) or else of the current OpenTelemetry context.

    With ``reopen`` (a fresh connection to the writer), an enqueue whose outcome was lost
    with its connection (during its COMMIT, in a failover) is resolved, never doubled: the
    jobs' ids are made here, so a fresh connection reads whether they are there (then
    confirmed durable) and, if not, sends the same jobs again."""
    with tracing.enqueue_span(settings, traceparent) as traced:
        jobs = to_new_jobs(specs, settings, traced.traceparent)
        traced.sent(jobs)
        children = datum_children(settings, objects)
        if list_first and any(job.is_parent for job in jobs):
            listed = {job.job_id: list(children(job)) for job in jobs if job.is_parent}

            def children(job: NewJob) -> Iterator[Sequence[NewJob]]:
                return iter(listed[job.job_id])

        return [a for answers in _enqueue(store, [(jobs, None)], children, Kept(), reopen)
                for a in answers]


def submit_stream(settings: Settings, store: Store, specs: Iterable[Sequence[JobSpec]], *,
                  traceparent: str | None = None,
                  reopen: Callable[[], Store] | None = None) -> Iterator[list[Enqueued]]:
    """``submit`` for a list of any length, given batch by batch (``specs``): every batch
    inserted as it comes, in one transaction, all or nothing; the answers, batch by batch,
    once it has committed. What it keeps meanwhile (each batch sent, to send again if the
    commit's outcome is lost, and its answers) is in a private temporary file, so memory
    stays flat however long the list."""
    with tracing.enqueue_span(settings, traceparent) as traced:

        def batches() -> Iterator[Sent]:
            for batch in specs:
                jobs = to_new_jobs(batch, settings, traced.traceparent)
                traced.sent(jobs)
                yield jobs, json.dumps([job.row() for job in jobs])

        yield from _enqueue(store, read_ahead(batches()), datum_children(settings, None),
                            Spooled(), reopen)


Sent = tuple[Sequence[NewJob], str | None]
"""A batch of new jobs, with their rows' JSON when made ahead (``Jobs.insert_many``)."""


class Kept:
    """What an enqueue keeps while it runs: each batch sent (sent again when the outcome of
    its commit is lost) and each batch's answers, by try (``retry``): the answers given are
    those of the try that committed — a try rolled back is ``dropped``. In memory;
    ``Spooled`` keeps them on disk."""

    def __init__(self) -> None:
        self._sent: list[Sent] = []
        self._tries: list[list[list[Enqueued]]] = [[]]

    def close(self) -> None:
        self._sent, self._tries = [], [[]]

    def keep_sent(self, batch: Sent) -> None:
        self._sent.append(batch)

    def sent(self) -> Iterator[Sent]:
        return iter(self._sent)

    def retry(self) -> None:
        self._tries.append([])

    def drop(self) -> None:
        self._tries.pop()

    def keep_answers(self, answers: list[Enqueued]) -> None:
        self._tries[-1].append(answers)

    def answers(self) -> Iterator[list[Enqueued]]:
        return iter(self._tries[-1])


class Spooled(Kept):
    """``Kept`` in private temporary files (gone once closed), read back in order: a batch
    sent as its rows' JSON (the jobs made again from it only to send it again), its answers
    as plain tuples (pickled at C speed), a file for each try."""

    def __init__(self) -> None:
        super().__init__()
        try:
            self._sent_file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
            self._answer_files = [tempfile.TemporaryFile()]  # noqa: SIM115 - as above
        except OSError as exc:
            raise ConfigError("cannot make the enqueue's private temporary file (TMPDIR, "
                              f"else /tmp): {exc.strerror or exc}") from None

    def close(self) -> None:
        for f in [self._sent_file, *self._answer_files]:
            f.close()

    def keep_sent(self, batch: Sent) -> None:
        jobs, rows = batch
        _dump(self._sent_file, rows if rows is not None
              else json.dumps([j.row() for j in jobs]))

    def sent(self) -> Iterator[Sent]:
        for rows in _read(self._sent_file):
            yield [NewJob.from_row(row) for row in json.loads(rows)], rows

    def retry(self) -> None:
        self._answer_files.append(tempfile.TemporaryFile())  # noqa: SIM115 - as above

    def drop(self) -> None:
        self._answer_files.pop().close()

    def keep_answers(self, answers: list[Enqueued]) -> None:
        _dump(self._answer_files[-1], [(a.job_id.int, *a[1:]) for a in answers])

    def answers(self) -> Iterator[list[Enqueued]]:
        for kept in _read(self._answer_files[-1]):
            yield [Enqueued(UUID(int=job_id), *rest) for job_id, *rest in kept]


def _dump(f: IO[bytes], value: object) -> None:
    f.seek(0, os.SEEK_END)
    pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)


def _read(f: IO[bytes]) -> Iterator[Any]:
    end, at = f.seek(0, os.SEEK_END), 0
    while at < end:
        f.seek(at)
        value = pickle.load(f)  # noqa: S301 - a private file this process wrote
        at = f.tell()
        yield value


def datum_children(settings: Settings,
              objects: Callable[[], ObjectStore] | None) -> ChildBatches:
    """A datum parent's children from the S3 listing of its inputs, batch by batch."""
    opened = objects or (lambda: open_object_store(settings))

    def children(parent: NewJob) -> Iterator[list[NewJob]]:
        output_bucket(settings)  # outputs and the manifest need a bucket: say so first
        inputs = parent.inputs
        try:
            yield from child_batches(inputs["url"], inputs["per_datum"], opened())(parent)
        except ObjectStoreError as exc:
            if exc.code == "NoSuchBucket":
                raise NotFound(f"cannot list inputs: {exc}") from None
            raise Unavailable(f"cannot list inputs: {exc}") from None

    return children


def _enqueue(store: Store, batches: Iterable[Sent], children: ChildBatches,
             kept: Kept, reopen: Callable[[], Store] | None) -> Iterator[list[Enqueued]]:
    """Write ``batches`` in one transaction, keeping each and its answers in ``kept``; then
    the answers, batch by batch (new waiting jobs looked at again after the commit)."""
    fresh = iter(batches)
    reopened: Store | None = None
    try:
        try:
            owned = _write(store, kept, fresh, children, resend=False)
        except StoreUnavailable as exc:
            if reopen is None:
                raise
            store = reopened = _resolve(reopen, kept, fresh, children, lost=exc)
            owned = True
        for answers in kept.answers():
            yield store.jobs.settled_late(answers) if owned else answers
    finally:
        kept.close()
        if reopened is not None:
            reopened.conn.close()


def _write(store: Store, kept: Kept, fresh: Iterator[Sent], children: ChildBatches, *,
           resend: bool) -> bool:
    """One transaction: the batches kept (when ``resend``), then the rest of ``fresh``,
    each kept as it goes; whether it was the enqueue's own (not the caller's)."""
    with store.jobs.enqueuing() as adding:
        if resend:
            for jobs, rows in kept.sent():
                kept.keep_answers(adding.add(jobs, children, rows))
        for batch in fresh:
            kept.keep_sent(batch)
            kept.keep_answers(adding.add(batch[0], children, batch[1]))
    return adding.owned


RESOLVE_SECONDS = 60.0
"""How long an enqueue whose outcome was lost keeps trying to learn it (a failover is
typically well under a minute)."""


def _resolve(reopen: Callable[[], Store], kept: Kept, fresh: Iterator[Sent],
             children: ChildBatches, *, lost: StoreUnavailable) -> Store:
    """The enqueue ``kept`` was sent and its answer lost: on fresh connections, find
    whether it committed (one transaction: any of its new jobs tells) and keep the answers
    it had, or send it again with the rest of ``fresh``; the connection that learnt it (the
    caller closes it). StoreUnavailable, naming the jobs, when that cannot be learnt in
    RESOLVE_SECONDS."""
    log = get_logger("jobfence.enqueue")
    first = next(iter(kept.sent()))[0][0]
    log.warning("enqueue_outcome_unknown", first_job=str(first.job_id), error=str(lost))
    until = time.monotonic() + RESOLVE_SECONDS
    while True:
        store = None
        try:
            store = reopen()
            if any(store.dependencies.status([j.job_id for j in jobs])
                   for jobs, _ in kept.sent()):
                confirm_durable(store.conn)  # committed: the answers kept are its own
                log.info("enqueue_outcome_resolved", committed=True)
            else:  # never committed (or only replays): the same jobs again
                log.info("enqueue_outcome_resolved", committed=False)
                kept.retry()
                try:
                    _write(store, kept, fresh, children, resend=True)
                except BaseException:
                    kept.drop()  # rolled back: the answers are another try's
                    raise
            return store
        except StoreUnavailable as exc:
            _close(store)
            if time.monotonic() >= until:
                raise StoreUnavailable(
                    f"{exc}: the outcome of enqueueing job {first.job_id} (and those sent "
                    "with it) is unknown") from None
            log.warning("enqueue_retry", error=str(exc))
        except Conflict as exc:
            _close(store)
            # the first try, still committing when read, committed under the second
            if "jobs_pkey" not in str(exc) or time.monotonic() >= until:
                raise
            time.sleep(0.5)


def _close(store: Store | None) -> None:
    if store is not None:
        store.conn.close()


def read_ahead(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``items``, made by a thread of their own at most ``depth`` ahead of their use: the
    next batch of specs is read and validated while the last one is written. What the
    thread raises is raised here, at the item it would have been; the thread stops when
    this iterator is closed."""
    handed: queue.Queue[tuple[bool, object]] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def hand(ok: bool, item: object) -> bool:
        while not stop.is_set():
            try:
                handed.put((ok, item), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in items:
                if not hand(True, item):
                    return
            hand(True, end)
        except BaseException as exc:  # raised again in the reader
            hand(False, exc)

    threading.Thread(target=run, name="jobfence-specs", daemon=True).start()
    try:
        while True:
            ok, item = handed.get()
            if not ok:
                assert isinstance(item, BaseException)
                raise item
            if item is end:
                return
            yield cast(T, item)
    finally:
        stop.set()


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
