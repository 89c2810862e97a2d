"""The object-store port: only what the functions call, with S3 (boto3) behind it in
``jobfence.adapters.s3`` and an in-memory fake in ``devtools.memory_objects``.

Layout under the bucket (docs/REFERENCE.md): everything an installation writes lives under
``jobfence/INSTALLATION/`` — outputs of an attempt under ``…/JOB_ID/ATTEMPT_ID/…`` so a
fenced-out attempt can never overwrite the winner's, a parent's manifest at
``…/JOB_ID/manifest.json`` — so installations sharing a bucket never see each other's
objects. Releases before the installation identity wrote ``jobfence/JOB_ID/…``
(``legacy_job_prefix``): those objects stay readable and go with their job's retention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO, Protocol
from uuid import UUID

from jobfence.errors import ConfigError, InvalidSpec, ObjectStoreError
from jobfence.settings import Settings

__all__ = ["DeleteFailure", "ObjectInfo", "ObjectStore", "ObjectStoreError"]

PREFIX = "jobfence/"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: datetime


@dataclass(frozen=True, slots=True)
class DeleteFailure:
    key: str
    error: str


class ObjectStore(Protocol):
    def iter_objects(self, bucket: str, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under ``prefix``, in key order, fetched page by page (bounded
        memory however many there are)."""
        ...

    def download_to(self, bucket: str, key: str, dest: BinaryIO,
                    progress: Callable[[int], None] | None = None) -> None:
        """Write the object into ``dest``, a file open for writing (never a path: a job's
        files are reached through descriptors, jobfence.fsboundary); ``progress`` is told
        the bytes of each part as it arrives (a long transfer is progress, not silence)."""
        ...

    def upload_from(self, bucket: str, key: str, src: BinaryIO,
                    progress: Callable[[int], None] | None = None) -> None:
        """Upload what ``src``, a file open for reading, holds from its start; ``progress``
        is told the bytes of each part as it is sent."""
        ...

    def put_bytes(self, bucket: str, key: str, data: bytes,
                  content_type: str = "application/octet-stream") -> None: ...

    def get_bytes(self, bucket: str, key: str) -> bytes: ...

    def delete_many(self, bucket: str, keys: Sequence[str]) -> list[DeleteFailure]:
        """Delete up to 1000 keys; the ones that could not be deleted, with why."""
        ...


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → (bucket, prefix)."""
    if not url.startswith("s3://"):
        raise InvalidSpec(f"{url!r} is not an s3:// url")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise InvalidSpec(f"{url!r} has no bucket")
    return bucket, prefix


def s3_url(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def installation_prefix(installation: str) -> str:
    """Everything one installation writes to its bucket, and all orphan-cleanup looks at."""
    return f"{PREFIX}{installation}/"


def job_prefix(installation: str, job_id: UUID) -> str:
    return f"{PREFIX}{installation}/{job_id}/"


def attempt_prefix(installation: str, job_id: UUID, attempt_id: UUID) -> str:
    return f"{PREFIX}{installation}/{job_id}/{attempt_id}/"


def log_prefix(installation: str, job_id: UUID, attempt_id: UUID, action_index: int,
               stream: str) -> str:
    """Where one stream of one action of an attempt is kept (``jobfence.worker.output``):
    beside the job's outputs, never among them."""
    return f"{job_prefix(installation, job_id)}logs/{attempt_id}/{action_index}/{stream}/"


def log_key(installation: str, job_id: UUID, attempt_id: UUID, action_index: int,
            stream: str, *, sequence: int) -> str:
    """The ``sequence``-th object (from 1) of that stream: its keys sort in order."""
    return f"{log_prefix(installation, job_id, attempt_id, action_index, stream)}{sequence:08d}"


def manifest_key(installation: str, job_id: UUID) -> str:
    return f"{PREFIX}{installation}/{job_id}/manifest.json"


def legacy_job_prefix(job_id: UUID) -> str:
    """Where a release before the installation identity wrote a job's objects."""
    return f"{PREFIX}{job_id}/"


def output_bucket(settings: Settings) -> str:
    if not settings.s3_bucket:
        raise ConfigError("JOBFENCE_S3_BUCKET is required for S3 inputs, outputs and manifests")
    return settings.s3_bucket
