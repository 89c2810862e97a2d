"""Datums on S3: a job over many input objects runs as one child job per datum.

At enqueue, a job with ``inputs`` becomes a parent with one child per input object (or per
``per_datum`` objects), made page by page from the listing so that 100k inputs never sit in
memory at once.

While an attempt runs, ``AttemptFiles`` downloads the child's inputs and publishes its
outputs, through descriptors of the job's space (a ``JobSpace``): every output is
registered under the fence before upload (``running``) and confirmed after
(``done``/``error``). A fenced-out attempt's registration matches nothing,
so it raises ``FenceLost`` and uploads nothing; whatever it uploaded before losing the fence
lives under its own attempt prefix and is never listed as committed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, BinaryIO, TypeVar
from uuid import UUID

from jobfence.actions.child import JobSpace
from jobfence.errors import ConfigError, FenceLost
from jobfence.fsboundary import Listed, Refused
from jobfence.ids import uuid7
from jobfence.limits import Unstorable, check_text
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore, ObjectStoreError, attempt_prefix, parse_s3_url, s3_url
from jobfence.store import NewJob, Store

log = get_logger("jobfence.datums")

CHILD_BATCH = 1000
TRANSFER_THREADS = 8
FILES_AT_ONCE = 64
"""Input or output files open at once (and handed over by the command sidecar in one
message): the command sidecar's MAX_FDS."""

REFUSALS_KEPT = 100
"""Refused outputs named in an action's result (the count says how many there were)."""


@dataclass(frozen=True, slots=True)
class Published:
    urls: list[str]
    refused: list[Refused]

    def result(self) -> dict[str, Any]:
        """What an action's result says of its outputs."""
        out: dict[str, Any] = {"outputs": self.urls}
        if self.refused:
            out["outputs_refused"] = [r.as_dict() for r in self.refused[:REFUSALS_KEPT]]
            out["outputs_refused_count"] = len(self.refused)
        return out


def input_base(prefix: str) -> str:
    """The part of a prefix that input names are relative to: the prefix itself when it
    ends with '/', else its directory (``in/day=1`` → ``in/``)."""
    if not prefix or prefix.endswith("/"):
        return prefix
    return prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""


def child_batches(url: str, per_datum: int, objects: ObjectStore,
                  batch_size: int = CHILD_BATCH) -> Callable[[NewJob], Iterator[list[NewJob]]]:
    """For ``Store.enqueue``: the children of a parent, from the S3 listing of
    ``url``, ``batch_size`` children at a time."""
    bucket, prefix = parse_s3_url(url)
    base = input_base(prefix)

    def make(parent: NewJob) -> Iterator[list[NewJob]]:
        batch: list[NewJob] = []
        keys: list[str] = []
        for obj in objects.iter_objects(bucket, prefix):
            if obj.key.endswith("/"):
                continue  # a "folder" marker, not an input
            keys.append(obj.key)
            if len(keys) == per_datum:
                batch.append(_child(parent, bucket, base, keys))
                keys = []
                if len(batch) == batch_size:
                    yield batch
                    batch = []
        if keys:
            batch.append(_child(parent, bucket, base, keys))
        if batch:
            yield batch

    return make


def _child(parent: NewJob, bucket: str, base: str, keys: list[str]) -> NewJob:
    return NewJob(
        job_id=uuid7(), actions=parent.actions, max_attempts=parent.max_attempts,
        priority=parent.priority, parent_id=parent.job_id, labels=parent.labels,
        timeout_seconds=parent.timeout_seconds, waiting=bool(parent.after),
        inputs={"bucket": bucket, "base": base, "keys": keys}, queue=parent.queue,
        run_at=parent.run_at, delay_seconds=parent.delay_seconds,
        traceparent=parent.traceparent, group_key=parent.group_key,
    )


FencedWrite = Callable[[Callable[[Store], bool]], "bool | None"]


class AttemptFiles:
    """Inputs in, outputs out, for one attempt of one job."""

    def __init__(self, *, job_id: UUID, attempt_id: UUID, inputs: Any,
                 objects: Callable[[], ObjectStore], bucket: str | None, installation: str,
                 write: FencedWrite, touch: Callable[[], None] = lambda: None) -> None:
        self.installation = installation
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.inputs = inputs if isinstance(inputs, dict) else None
        self._objects = objects
        self.bucket = bucket
        self._write = write
        self._touch = touch
        """Progress, for the inactivity timeout: a file came or went."""

    def download_inputs(self, space: JobSpace) -> list[str]:
        """Download this job's input objects into the space's ``inputs/``, each into a new
        file the space made (never by a path into the job's directory): a datum's keep their
        names relative to the input prefix; a workflow step's ``files`` (the outputs of the
        steps before it) their ``STEP/NAME``. The relative names."""
        if not self.inputs:
            return []
        wanted: list[tuple[str, str, str]] = []  # bucket, key, name in inputs/
        if "files" in self.inputs:
            for f in self.inputs["files"]:
                wanted.append((*parse_s3_url(f["url"]), f["name"]))
        elif "keys" in self.inputs:
            bucket, base = self.inputs["bucket"], self.inputs.get("base", "")
            wanted += [(bucket, key, key[len(base):] if key.startswith(base) else key)
                       for key in self.inputs["keys"]]
        for i, (bucket, key, name) in enumerate(wanted):
            rel = PurePosixPath(name)
            if rel.is_absolute() or ".." in rel.parts or not rel.parts:
                raise ObjectStoreError(f"refusing input {key!r} as {name!r}: it escapes the "
                                       "input dir")
            wanted[i] = (bucket, key, rel.as_posix())
        store = self._objects()
        for batch in _batches(wanted):
            files = space.create_inputs([name for *_, name in batch])
            try:
                with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
                    list(pool.map(lambda w: self._download(store, *w),
                                  [(bucket, key, f) for (bucket, key, _), f
                                   in zip(batch, files, strict=True)]))
            finally:
                for f in files:
                    f.close()
        return [name for *_, name in wanted]

    def _download(self, store: ObjectStore, bucket: str, key: str, f: BinaryIO) -> None:
        store.download_to(bucket, key, f, progress=lambda _sent: self._touch())
        self._touch()

    def publish_outputs(self, space: JobSpace) -> Published:
        """Upload every regular file of the job's under the space's ``outputs/`` to the
        attempt's prefix, registered and confirmed under the fence; the URLs, and what was
        refused (links, FIFOs, sockets, devices, hard links, files of other users) with why.
        Raises FenceLost if the fence is gone."""
        listed, refused = space.list_outputs()
        if refused:
            log.warning("outputs_refused", job_id=str(self.job_id), count=len(refused),
                        first=refused[0].path, why=refused[0].why)
        if not listed:
            return Published([], refused)
        if not self.bucket:
            raise ConfigError("the job wrote outputs but JOBFENCE_S3_BUCKET is not set")
        prefix = attempt_prefix(self.installation, self.job_id, self.attempt_id)
        for item in listed:
            try:
                check_text(item.path, "output file name")
            except Unstorable as exc:
                raise ObjectStoreError(f"{exc}: {item.path.encode(errors='replace')!r}") from None
        urls = [(item.path, s3_url(self.bucket, prefix + item.path)) for item in listed]
        if not self._write(lambda s: s.attempts.register_outputs(
                job_id=self.job_id, attempt_id=self.attempt_id, outputs=urls)):
            raise FenceLost(self.job_id, self.attempt_id, ": outputs not registered")
        store, bucket = self._objects(), self.bucket

        def upload(entry: tuple[Listed, BinaryIO | str]) -> dict[str, Any]:
            item, f = entry
            if isinstance(f, str):
                return {"path": item.path, "status": "error", "size_bytes": None,
                        "error": f"not uploaded: {f}"}
            size = os.fstat(f.fileno()).st_size
            try:
                # each part sent is progress: a long upload never looks inactive
                store.upload_from(bucket, prefix + item.path, f,
                                  progress=lambda _sent: self._touch())
            except ObjectStoreError as exc:
                return {"path": item.path, "status": "error", "size_bytes": None,
                        "error": str(exc)}
            finally:
                self._touch()
            return {"path": item.path, "status": "done", "size_bytes": size, "error": None}

        results: list[dict[str, Any]] = []
        for batch in _batches(listed):
            opened = space.open_outputs(batch)
            try:
                with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
                    results += pool.map(upload, zip(batch, opened, strict=True))
            finally:
                for f in opened:
                    if not isinstance(f, str):
                        f.close()
        if not self._write(lambda s: s.attempts.confirm_outputs(
                job_id=self.job_id, attempt_id=self.attempt_id, outputs=results)):
            raise FenceLost(self.job_id, self.attempt_id, ": outputs not confirmed")
        failed = [r for r in results if r["status"] == "error"]
        if failed:
            raise ObjectStoreError(f"{len(failed)} of {len(results)} outputs failed to "
                                   f"upload, first: {failed[0]['path']}: {failed[0]['error']}")
        log.info("outputs_published", job_id=str(self.job_id), count=len(results))
        return Published([u for _, u in urls], refused)


T = TypeVar("T")


def _batches(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """Files go through descriptors: at most FILES_AT_ONCE of them are open at once."""
    for i in range(0, len(items), FILES_AT_ONCE):
        yield items[i:i + FILES_AT_ONCE]
