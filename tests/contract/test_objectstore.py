"""One suite for every implementation of the object-store port: S3 (boto3 against moto's
server on 127.0.0.1) and the in-memory fake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devtools.memory_objects import MemoryObjectStore
from jobfence.adapters.s3 import S3ObjectStore
from jobfence.errors import InvalidSpec
from jobfence.ids import uuid7
from jobfence.objectstore import (
    ObjectStore,
    ObjectStoreError,
    attempt_prefix,
    installation_prefix,
    job_prefix,
    legacy_job_prefix,
    manifest_key,
    parse_s3_url,
)


@pytest.fixture(params=["s3", "memory"])
def objects(request: Any) -> tuple[ObjectStore, str]:
    if request.param == "memory":
        return MemoryObjectStore(), "bucket"
    env = request.getfixturevalue("s3_env")
    store = S3ObjectStore(endpoint_url=env["JOBFENCE_S3_ENDPOINT_URL"], page_size=7)
    return store, env["JOBFENCE_S3_BUCKET"]


def test_put_get_and_files(objects: tuple[ObjectStore, str], tmp_path: Path) -> None:
    store, bucket = objects
    store.put_bytes(bucket, "a/b.txt", b"hello")
    assert store.get_bytes(bucket, "a/b.txt") == b"hello"
    src = tmp_path / "src.bin"
    src.write_bytes(b"\x00" * 100)
    with src.open("rb") as f:
        f.read(10)  # uploaded from its start whatever was read
        store.upload_from(bucket, "a/c.bin", f)
    with (tmp_path / "dest.bin").open("wb") as f:
        store.download_to(bucket, "a/c.bin", f)
    assert (tmp_path / "dest.bin").read_bytes() == b"\x00" * 100
    with pytest.raises(ObjectStoreError):
        store.get_bytes(bucket, "missing")


def test_listing_pages_through_everything_in_key_order(objects: tuple[ObjectStore, str]) -> None:
    store, bucket = objects
    keys = [f"in/{i:03d}.csv" for i in range(20)]
    for k in reversed(keys):
        store.put_bytes(bucket, k, k.encode())
    store.put_bytes(bucket, "other/x", b"x")
    listed = list(store.iter_objects(bucket, "in/"))
    assert [o.key for o in listed] == keys
    assert all(o.size == len(o.key) for o in listed)


def test_delete_many_reports_nothing_when_all_deleted(objects: tuple[ObjectStore, str]) -> None:
    store, bucket = objects
    for i in range(5):
        store.put_bytes(bucket, f"d/{i}", b"1")
    assert store.delete_many(bucket, [f"d/{i}" for i in range(5)] + ["d/never"]) == []
    assert list(store.iter_objects(bucket, "d/")) == []


def test_layout_helpers() -> None:
    job, attempt = uuid7(), uuid7()
    assert attempt_prefix("prod", job, attempt) == f"jobfence/prod/{job}/{attempt}/"
    assert manifest_key("prod", job) == f"jobfence/prod/{job}/manifest.json"
    assert job_prefix("prod", job) == f"jobfence/prod/{job}/"
    assert installation_prefix("prod") == "jobfence/prod/"
    assert legacy_job_prefix(job) == f"jobfence/{job}/"
    assert parse_s3_url("s3://bucket/some/prefix") == ("bucket", "some/prefix")
    assert parse_s3_url("s3://bucket") == ("bucket", "")
    with pytest.raises(InvalidSpec):
        parse_s3_url("http://x")
