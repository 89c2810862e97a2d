"""Three installations on one machine — two schemas of one database and a schema of another
database — with the `local` cluster and one S3 bucket, all three platforms running at once:
each runs jobs with outputs and a datum parent with its manifest, and every periodic
function ticks with every grace period at 0, while the others' workers run. None touches
another: no worker of one is signalled by another, no object of one is deleted by another,
every job of each succeeds exactly once, and every committed output of each is still
there. (One run covers both ways installations share a server: a database, and a
schema's neighbour in the same database.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from devtools.platform import LocalPlatform
from devtools.sqlconn import connect
from jobfence.adapters.s3 import S3ObjectStore
from jobfence.objectstore import parse_s3_url
from jobfence.pools import Pool
from tests.support import run_cli
from tests.support.pg import Databases

# Every periodic function ticks every few seconds, staggered, while all installations'
# workers run (ten function starts a second would take the whole of a 2-core machine).
SCHEDULE = {"sweeper": 2.5, "reconciliation": 3.0, "export-finalize": 2.0,
            "lifecycle": 3.5, "orphan-cleanup": 2.5}
GRACES_AT_ZERO = {"JOBFENCE_RECONCILE_GRACE_SECONDS": "0",
                  "JOBFENCE_ORPHAN_POD_GRACE_SECONDS": "0",
                  "JOBFENCE_ORPHAN_OBJECT_GRACE_SECONDS": "0"}
WRITE = "echo $JOBFENCE_JOB_ID > $JOBFENCE_OUTPUT_DIR/out.txt; sleep 0.7"


def installation_env(dsn: str, schema: str, s3_env: dict[str, str]) -> dict[str, str]:
    return {"JOBFENCE_DATABASE_URL": dsn, "JOBFENCE_SCHEMA": schema, **s3_env,
            **GRACES_AT_ZERO, "JOBFENCE_LEASE_SECONDS": "4",
            "JOBFENCE_HEARTBEAT_SECONDS": "0.5", "JOBFENCE_RETRY_BASE_SECONDS": "0.2",
            "JOBFENCE_LOG_FORMAT": "json", "JOBFENCE_TRIGGER": "scheduled"}


def cli(env: dict[str, str], *args: str, input: str | None = None) -> Any:
    extra = {k: v for k, v in env.items() if k != "JOBFENCE_DATABASE_URL"}
    r = run_cli(env["JOBFENCE_DATABASE_URL"], *args, input=input, **extra)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def enqueue_work(env: dict[str, str], name: str, s3: S3ObjectStore, bucket: str) -> list[str]:
    for i in range(2):
        s3.put_bytes(bucket, f"inputs-{name}/{i}.txt", f"{name} {i}".encode())
    specs = [{"actions": [{"name": "command", "params": {"argv": ["sh", "-c", WRITE]}}],
              "max_attempts": 5} for _ in range(3)]
    specs.append({"actions": [{"name": "command", "params": {"argv": ["sh", "-c", WRITE]}}],
                  "inputs": f"s3://{bucket}/inputs-{name}/", "max_attempts": 5})
    return [o["job_id"] for o in cli(env, "enqueue", "--spec", "-", input=json.dumps(specs))]


def wait_done(envs: list[dict[str, str]], timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active = 0
        for env in envs:
            with connect(env["JOBFENCE_DATABASE_URL"], schema=env["JOBFENCE_SCHEMA"]) as c:
                row = c.execute("SELECT count(*) AS n FROM jobs WHERE status IN "
                                "('waiting', 'pending', 'running')").fetchone()
            active += row["n"] if row else 0
        if active == 0:
            return
        time.sleep(0.5)
    raise AssertionError("the jobs of the installations did not finish")


def committed(env: dict[str, str]) -> tuple[set[str], set[str]]:
    """Every committed output URL and every manifest URL of an installation."""
    with connect(env["JOBFENCE_DATABASE_URL"], schema=env["JOBFENCE_SCHEMA"]) as c:
        outputs = {r["url"] for r in c.execute(
            "SELECT o.url FROM job_outputs o JOIN jobs j USING (job_id) WHERE "
            "o.attempt_id = j.attempt_id AND j.status = 'succeeded' AND o.status = 'done'")}
        manifests = {r["manifest"] for r in c.execute(
            "SELECT manifest FROM jobs WHERE is_parent")}
        twice = c.execute("SELECT count(*) AS n FROM (SELECT job_id FROM job_events WHERE "
                          "to_status IN ('succeeded', 'failed', 'cancelled') GROUP BY job_id "
                          "HAVING count(*) > 1) t").fetchone()
        statuses = {r["status"] for r in c.execute("SELECT DISTINCT status FROM jobs")}
    assert twice is not None and twice["n"] == 0
    assert statuses == {"succeeded"}, statuses
    return outputs, manifests


def deleted_pods(logs: Path) -> list[str]:
    """Every pod an installation's orphan-cleanup deleted, from its log."""
    names = []
    log = logs / "orphan-cleanup.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "orphaned_pod_deleted":
            names.append(str(event["pod"]))
    return names


def test_installations_never_touch_each_other(
        databases: Databases, s3_env: dict[str, str], tmp_path: Path) -> None:
    first, second = databases.create(migrated=False), databases.create(migrated=False)
    envs = [installation_env(first, "jobfence", s3_env),
            installation_env(first, "tenant_b", s3_env),  # beside it in one database
            installation_env(second, "tenant_b", s3_env)]  # the same schema, another database
    s3 = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"])
    bucket = s3_env["JOBFENCE_S3_BUCKET"]
    platforms: list[LocalPlatform] = []
    try:
        names = []
        for env in envs:
            [migrated] = cli(env, "migrate")
            names.append(migrated["installation"])
        assert len(set(names)) == len(names), names
        for name, env in zip(names, envs, strict=True):
            platforms.append(LocalPlatform(env["JOBFENCE_DATABASE_URL"], env,
                                           tmp_path / name, schedules=SCHEDULE,
                                           pools=(Pool(name="default", maxPods=3),)))
        for env, name in zip(envs, names, strict=True):
            enqueue_work(env, name, s3, bucket)
        for p in platforms:
            p.start()
        wait_done(envs)
        time.sleep(4.0)  # every periodic function ticks again with nothing left to do
    finally:
        for p in platforms:
            p.stop()
    try:
        check(names, envs, platforms, s3, bucket, tmp_path)
    finally:
        for url in (first, second):
            databases.drop(url)


def check(names: list[str], envs: list[dict[str, str]], platforms: list[LocalPlatform],
          s3: S3ObjectStore, bucket: str, tmp_path: Path) -> None:
    for name, env, p in zip(names, envs, platforms, strict=True):
        outputs, manifests = committed(env)
        assert len(outputs) == 3 + 2 and len(manifests) == 1
        keys = {f"s3://{bucket}/{o.key}" for o in s3.iter_objects(bucket, "jobfence/")}
        assert outputs | manifests <= keys, f"{name} lost committed objects"
        assert all(u.startswith(f"s3://{bucket}/jobfence/{name}/") for u in outputs)
        # What its orphan-cleanup deleted were its own workers, never the other's.
        pids = {int(pod.rsplit(":", 1)[1]) for pod in deleted_pods(tmp_path / name)}
        assert pids <= p.worker_pids, pids - p.worker_pids
        assert p.function_runs["orphan-cleanup"] >= 3
        for manifest in manifests:
            data = json.loads(s3.get_bytes(*parse_s3_url(manifest)))
            assert data["children"] == {"total": 2, "succeeded": 2}
