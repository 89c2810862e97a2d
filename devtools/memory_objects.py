"""An in-memory object store, with faults on demand: for unit tests, and for integration
tests beside a real store where a put or a delete must fail at a chosen moment."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import BinaryIO

from jobfence.objectstore import DeleteFailure, ObjectInfo, ObjectStoreError


class MemoryObjectStore:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], tuple[bytes, datetime]] = {}
        self.fail_deletes: set[str] = set()
        """Keys (or key prefixes) whose deletion fails, to test what survives a failure."""
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def iter_objects(self, bucket: str, prefix: str) -> Iterator[ObjectInfo]:
        self.calls.append("list")
        with self._lock:
            keys = sorted(k for b, k in self.objects if b == bucket and k.startswith(prefix))
        for key in keys:
            with self._lock:
                item = self.objects.get((bucket, key))
            if item is not None:
                yield ObjectInfo(key, len(item[0]), item[1])

    def download_to(self, bucket: str, key: str, dest: BinaryIO,
                    progress: Callable[[int], None] | None = None) -> None:
        data = self.get_bytes(bucket, key)
        dest.write(data)
        if progress is not None:
            progress(len(data))

    def upload_from(self, bucket: str, key: str, src: BinaryIO,
                    progress: Callable[[int], None] | None = None) -> None:
        src.seek(0)
        data = src.read()
        self.put_bytes(bucket, key, data)
        if progress is not None:
            progress(len(data))

    def put_bytes(self, bucket: str, key: str, data: bytes,
                  content_type: str = "application/octet-stream") -> None:
        with self._lock:
            self.objects[(bucket, key)] = (data, datetime.now(UTC))

    def get_bytes(self, bucket: str, key: str) -> bytes:
        with self._lock:
            item = self.objects.get((bucket, key))
        if item is None:
            raise ObjectStoreError(f"no such key s3://{bucket}/{key}")
        return item[0]

    def delete_many(self, bucket: str, keys: Sequence[str]) -> list[DeleteFailure]:
        failures = []
        with self._lock:
            for key in keys:
                if any(key.startswith(p) for p in self.fail_deletes):
                    failures.append(DeleteFailure(key, "AccessDenied: injected"))
                else:
                    self.objects.pop((bucket, key), None)
        return failures
