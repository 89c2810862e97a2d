"""A command's outputs uploaded under the worker's rules, in process on a real database:
a long upload is progress (it never trips the action's inactivity timeout: each part sent
touches the guard, not only each whole file), and a stop that comes during the upload (the
job's run timeout) still ends the attempt as the stop says — released under its fence at
once — never ``lost`` with the job left running until the sweeper. The object store is the
in-memory one, made slow where a test needs a long upload; the S3 adapter's own progress
reports are checked against moto."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from devtools.memory_objects import MemoryObjectStore
from jobfence.db import Connection
from jobfence.settings import Settings
from jobfence.store import Store
from jobfence.worker import loop as loop_module
from jobfence.worker.loop import Worker
from tests.support.factories import enqueue_one


class SlowObjects(MemoryObjectStore):
    """An object store whose uploads take ``seconds``, reporting progress as they go (as
    boto3 does, per part sent)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def upload_from(self, bucket: str, key: str, src: BinaryIO,
                    progress: Callable[[int], None] | None = None) -> None:
        src.seek(0)
        data = src.read()
        for _ in range(int(self.seconds / 0.1)):
            time.sleep(0.1)
            if progress is not None:
                progress(len(data) // 10 or 1)
        self.put_bytes(bucket, key, data)


def writes_output(tmp: Path) -> list[str]:
    return ["sh", "-c", 'echo data > "$JOBFENCE_OUTPUT_DIR/out.txt"']


def run_worker(dsn: str, objects: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(loop_module, "open_object_store", lambda _settings: objects)
    return Worker(Settings(database_url=dsn, s3_bucket="b", lease_seconds=30,
                           stop_check_seconds=0.1, retry_base_seconds=0.05,
                           command_user="worker")).run(1)


def test_a_long_upload_does_not_trip_the_inactivity_timeout(
        dsn: str, store: Store, conn: Connection, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    job = enqueue_one(store, actions=[{"name": "command", "inactivity_timeout": "PT1S",
                                       "params": {"argv": writes_output(tmp_path)}}])
    objects = SlowObjects(seconds=3.0)
    report = run_worker(dsn, objects, monkeypatch)
    assert (report.succeeded, report.failed, report.retried) == (1, 0, 0), report
    row = conn.execute("SELECT status FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row is not None and row["status"] == "succeeded"
    assert [k for (_, k) in objects.objects if k.endswith("out.txt")]


def test_a_run_timeout_during_the_upload_releases_the_job_at_once(
        dsn: str, store: Store, conn: Connection, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    job = enqueue_one(store, actions=[{"name": "command",
                                       "params": {"argv": writes_output(tmp_path)}}],
                      timeout_seconds=2, max_attempts=1)
    report = run_worker(dsn, SlowObjects(seconds=5.0), monkeypatch)
    assert report.lost == 0 and report.failed == 1, report
    row = conn.execute("SELECT status, error FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row is not None and row["status"] == "failed" and "timed out" in row["error"]


def test_the_s3_adapter_reports_progress_per_part(s3_env: dict[str, str],
                                                   tmp_path: Path) -> None:
    from jobfence.adapters.s3 import S3ObjectStore

    s3 = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"],
                       access_key_id="testing", secret_access_key="testing")
    size = 20 * 1024 * 1024
    src = tmp_path / "big"
    src.write_bytes(b"x" * size)
    sent: list[int] = []
    with src.open("rb") as f:
        s3.upload_from(s3_env["JOBFENCE_S3_BUCKET"], "big", f, progress=sent.append)
    assert sum(sent) == size and len(sent) > 1
    got: list[int] = []
    with (tmp_path / "back").open("wb") as out:
        s3.download_to(s3_env["JOBFENCE_S3_BUCKET"], "big", out, progress=got.append)
    assert sum(got) == size and len(got) > 1
