"""S3 through boto3. Throttling and transient errors are retried by botocore's adaptive
retry mode (exponential backoff with a client-side rate limiter); whatever still fails —
botocore's errors, boto3's own transfer errors (``S3UploadFailedError`` wraps the service's
answer), a local file that cannot be read or written — is raised as ObjectStoreError with
the service's error code when there is one, so every caller can count it and go on."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, cast

import boto3
from boto3.exceptions import Boto3Error
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from jobfence.objectstore import DeleteFailure, ObjectInfo, ObjectStoreError

PAGE_SIZE = 1000


def _borrowed(f: BinaryIO, mode: str) -> BinaryIO:
    """A second file object on ``f``'s descriptor: boto3 closes the file it is given, and
    the caller's stays open."""
    return cast(BinaryIO, os.fdopen(os.dup(f.fileno()), mode))


class S3ObjectStore:
    def __init__(self, *, endpoint_url: str | None = None, region: str = "us-east-1",
                 access_key_id: str | None = None, secret_access_key: str | None = None,
                 max_attempts: int = 8, page_size: int = PAGE_SIZE, client: Any = None) -> None:
        self.page_size = page_size
        self.client = client or boto3.client(
            "s3", endpoint_url=endpoint_url, region_name=region,
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
            config=Config(retries={"mode": "adaptive", "max_attempts": max_attempts},
                          connect_timeout=5, read_timeout=60))

    def iter_objects(self, bucket: str, prefix: str) -> Iterator[ObjectInfo]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": self.page_size}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call("list_objects_v2", **kwargs)
            for obj in page.get("Contents", []):
                yield ObjectInfo(obj["Key"], int(obj["Size"]), obj["LastModified"])
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def download_to(self, bucket: str, key: str, dest: BinaryIO,
                    progress: Callable[[int], None] | None = None) -> None:
        dest.flush()
        with _borrowed(dest, "wb") as f:
            self._call("download_fileobj", bucket, key, f, Callback=progress)

    def upload_from(self, bucket: str, key: str, src: BinaryIO,
                    progress: Callable[[int], None] | None = None) -> None:
        with _borrowed(src, "rb") as f:
            f.seek(0)
            self._call("upload_fileobj", f, bucket, key, Callback=progress)

    def put_bytes(self, bucket: str, key: str, data: bytes,
                  content_type: str = "application/octet-stream") -> None:
        self._call("put_object", Bucket=bucket, Key=key, Body=data, ContentType=content_type)

    def get_bytes(self, bucket: str, key: str) -> bytes:
        body = self._call("get_object", Bucket=bucket, Key=key)["Body"]
        data: bytes = body.read()
        return data

    def delete_many(self, bucket: str, keys: Sequence[str]) -> list[DeleteFailure]:
        if not keys:
            return []
        if len(keys) > PAGE_SIZE:
            raise ValueError("at most 1000 keys per delete_many call")
        try:
            out = self._call("delete_objects", Bucket=bucket, Delete={
                "Objects": [{"Key": k} for k in keys], "Quiet": True})
        except ObjectStoreError as exc:
            return [DeleteFailure(k, str(exc)) for k in keys]
        return [DeleteFailure(e["Key"], f"{e.get('Code')}: {e.get('Message')}")
                for e in out.get("Errors", [])]

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, method)(*args, **kwargs)
        except (BotoCoreError, ClientError, Boto3Error, OSError) as exc:
            raise ObjectStoreError(f"s3 {method} failed: {exc}", code=_code(exc)) from exc


def _code(exc: BaseException | None) -> str | None:
    """The service's error code, also when a transfer error wraps the ClientError."""
    while exc is not None:
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code")
            return str(code) if code else None
        exc = exc.__cause__ or exc.__context__
    return None
