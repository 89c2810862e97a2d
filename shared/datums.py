"""Datums on S3, as Falconeri splits a job into datums.

At enqueue, a job with ``inputs`` becomes a parent with one child per input object (or per
``per_datum`` objects), made page by page from the listing so that 100k inputs never sit in
memory at once.

While an attempt runs, ``AttemptFiles`` downloads the child's inputs and publishes its
outputs: every output is registered under the fence before upload (``running``) and
confirmed after (``done``/``error``). A fenced-out attempt's registration matches nothing,
so it raises ``FenceLost`` and uploads nothing; whatever it uploaded before losing the fence
lives under its own attempt prefix and is never listed as committed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any
from uuid import UUID

from jobfence.errors import ConfigError, FenceLost
from jobfence.ids import uuid7
from jobfence.limits import Unstorable, check_text
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore, ObjectStoreError, attempt_prefix, parse_s3_url, s3_url
from jobfence.store import NewJob, Store

log = get_logger("jobfence.datums")

CHILD_BATCH = 1000
TRANSFER_THREADS = 8


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
    )


FencedWrite = Callable[[Callable[[Store], bool]], "bool | None"]


class AttemptFiles:
    """Inputs in, outputs out, for one attempt of one job."""

    def __init__(self, *, job_id: UUID, attempt_id: UUID, inputs: Any,
                 objects: Callable[[], ObjectStore], bucket: str | None, installation: str,
                 write: FencedWrite) -> None:
        self.installation = installation
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.inputs = inputs if isinstance(inputs, dict) else None
        self._objects = objects
        self.bucket = bucket
        self._write = write

    def download_inputs(self, dest: Path) -> list[str]:
        """Download this datum's objects into ``dest``, keeping their names relative to
        the input prefix; the relative names."""
        if not self.inputs:
            return []
        bucket, base = self.inputs["bucket"], self.inputs.get("base", "")
        pairs = []
        for key in self.inputs["keys"]:
            rel = PurePosixPath(key[len(base):] if key.startswith(base) else key)
            if rel.is_absolute() or ".." in rel.parts:
                raise ObjectStoreError(f"refusing input key {key!r}: it escapes the input dir")
            pairs.append((key, dest / rel))
        store = self._objects()
        with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
            list(pool.map(lambda kv: store.download(bucket, kv[0], kv[1]), pairs))
        return [str(p.relative_to(dest)) for _, p in pairs]

    def publish_outputs(self, src: Path) -> list[str]:
        """Upload every regular file under ``src`` to the attempt's prefix, registered and
        confirmed under the fence; the URLs. Raises FenceLost if the fence is gone."""
        files = sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink())
        if not files:
            return []
        if not self.bucket:
            raise ConfigError("the job wrote outputs but JOBFENCE_S3_BUCKET is not set")
        prefix = attempt_prefix(self.installation, self.job_id, self.attempt_id)
        entries = [(p.relative_to(src).as_posix(), p) for p in files]
        for rel, _ in entries:
            try:
                check_text(rel, "output file name")
            except Unstorable as exc:
                raise ObjectStoreError(f"{exc}: {rel.encode(errors='replace')!r}") from None
        urls = [(rel, s3_url(self.bucket, prefix + rel)) for rel, _ in entries]
        if not self._write(lambda s: s.attempts.register_outputs(
                job_id=self.job_id, attempt_id=self.attempt_id, outputs=urls)):
            raise FenceLost(self.job_id, self.attempt_id, ": outputs not registered")
        store, bucket = self._objects(), self.bucket

        def upload(entry: tuple[str, Path]) -> dict[str, Any]:
            rel, path = entry
            try:
                store.upload(bucket, prefix + rel, path)
            except ObjectStoreError as exc:
                return {"path": rel, "status": "error", "size_bytes": None, "error": str(exc)}
            return {"path": rel, "status": "done", "size_bytes": path.stat().st_size,
                    "error": None}

        with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
            results = list(pool.map(upload, entries))
        if not self._write(lambda s: s.attempts.confirm_outputs(
                job_id=self.job_id, attempt_id=self.attempt_id, outputs=results)):
            raise FenceLost(self.job_id, self.attempt_id, ": outputs not confirmed")
        failed = [r for r in results if r["status"] == "error"]
        if failed:
            raise ObjectStoreError(f"{len(failed)} of {len(results)} outputs failed to "
                                   f"upload, first: {failed[0]['path']}: {failed[0]['error']}")
        log.info("outputs_published", job_id=str(self.job_id), count=len(results))
        return [u for _, u in urls]
