"""Datum jobs through the real CLI, real worker processes, real PostgreSQL and moto's S3
server: inputs split into children, outputs uploaded under attempt prefixes, the parent
finalized exactly once with a manifest of committed outputs only, and a killed attempt's
partial outputs removed by orphan-cleanup."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import pytest

from jobfence.adapters.s3 import S3ObjectStore
from jobfence.objectstore import parse_s3_url
from tests.support import JOBFENCE, REPO, cli_env, run_cli
from tests.support.procs import FAST, events, job, spawn, wait_for

UPPER = ("for f in \"$JOBFENCE_INPUT_DIR\"/*; do "
         "tr a-z A-Z < \"$f\" > \"$JOBFENCE_OUTPUT_DIR/$(basename \"$f\").out\"; done")


def s3(env: dict[str, str]) -> S3ObjectStore:
    return S3ObjectStore(endpoint_url=env["JOBFENCE_S3_ENDPOINT_URL"])


def put_inputs(env: dict[str, str], n: int, prefix: str = "in/") -> str:
    store, bucket = s3(env), env["JOBFENCE_S3_BUCKET"]
    for i in range(n):
        store.put_bytes(bucket, f"{prefix}{i:04d}.txt", f"datum {i}\n".encode())
    return f"s3://{bucket}/{prefix}"


def enqueue_spec(dsn: str, env: dict[str, str], spec: dict[str, object]) -> dict[str, object]:
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(spec), **env)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def manifest(env: dict[str, str], url: str) -> dict[str, object]:
    bucket, key = parse_s3_url(url)
    return dict(json.loads(s3(env).get_bytes(bucket, key)))


def test_two_hundred_datums_four_workers_each_child_once(dsn: str, s3_env: dict[str, str]) -> None:
    url = put_inputs(s3_env, 200)
    parent = enqueue_spec(dsn, s3_env, {"actions": [{"name": "command", "params": {
        "argv": ["sh", "-c", UPPER]}}], "inputs": url})
    assert parent["status"] == "running" and parent["children"] == 200
    # The children's commands run as another user (the worker is root here): their inputs
    # are handed over to it, and what they write is uploaded.
    workers = [spawn(dsn, "worker", "--max-jobs", "200", JOBFENCE_COMMAND_USER="nobody",
                     **s3_env) for _ in range(4)]
    outs = [w.communicate(timeout=180) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0, 0], [e[-2000:] for _, e in outs]
    reports = [json.loads(o) for o, _ in outs]
    assert sum(r["succeeded"] for r in reports) == 200
    assert all(r["claimed"] > 0 for r in reports)  # all four took part
    pid = str(parent["job_id"])
    row = job(dsn, pid)  # finalized by the worker that ran the last datum
    assert row["status"] == "succeeded"
    r = run_cli(dsn, "export-finalize", **s3_env)  # the safety net finds nothing left
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["parents_ready"] == 0
    assert row["status"] == "succeeded"
    assert len([e for e in events(dsn, pid) if e["to_status"] == "succeeded"]) == 1
    m = manifest(s3_env, row["manifest"])
    assert m["children"] == {"total": 200, "succeeded": 200}
    items = m["items"]
    assert isinstance(items, list) and len(items) == 200
    store = s3(s3_env)
    outputs = [u for item in items for u in item["outputs"]]
    assert len(outputs) == 200 and len(set(outputs)) == 200
    for item in items:
        [inp] = item["inputs"]
        [out] = item["outputs"]
        n = int(inp.rsplit("/", 1)[1].split(".")[0])
        assert out.endswith(f"/{item['job_id']}/{item['attempt_id']}/{n:04d}.txt.out")
        assert store.get_bytes(*parse_s3_url(out)) == f"DATUM {n}\n".encode()
    for item in items:  # each child ran once
        claims = [e for e in events(dsn, item["job_id"]) if e["to_status"] == "running"]
        assert len(claims) == 1


def test_killed_after_partial_upload_retry_outputs_committed(
        dsn: str, s3_env: dict[str, str]) -> None:
    url = put_inputs(s3_env, 1, prefix="one/")
    many = ("i=0; while [ $i -lt 150 ]; do "
            "echo $i > \"$JOBFENCE_OUTPUT_DIR/part-$i\"; i=$((i+1)); done")
    parent = enqueue_spec(dsn, s3_env, {"actions": [{"name": "command", "params": {
        "argv": ["sh", "-c", many]}}], "inputs": url})
    pid = str(parent["job_id"])
    worker = spawn(dsn, "worker", **s3_env)
    store, bucket = s3(s3_env), s3_env["JOBFENCE_S3_BUCKET"]
    # Kill the worker as soon as its first outputs have landed: the upload is half done.
    wait_for(lambda: any(o.key.startswith("jobfence/") and "part-" in o.key
                         for o in store.iter_objects(bucket, "jobfence/")), timeout=30,
             interval=0.005)
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=10)
    [child] = [r for r in [job(dsn, e) for e in _children(dsn, pid)]]
    first_attempt = str(child["attempt_id"])
    wait_for(lambda: job(dsn, str(child["job_id"]))["visible_at"].timestamp() < time.time(),
             timeout=10)
    assert run_cli(dsn, "sweeper", **FAST).returncode == 0
    r = run_cli(dsn, "worker", **FAST, **s3_env)
    assert r.returncode == 0, r.stderr
    assert run_cli(dsn, "export-finalize", **s3_env).returncode == 0
    row = job(dsn, pid)
    assert row["status"] == "succeeded"
    [item] = manifest(s3_env, row["manifest"])["items"]  # type: ignore[misc]
    assert item["attempt_id"] != first_attempt
    assert len(item["outputs"]) == 150
    assert not any(first_attempt in u for u in item["outputs"])
    assert all(f"/{item['attempt_id']}/" in u for u in item["outputs"])
    # The killed attempt's partial outputs are garbage: orphan-cleanup deletes them, and
    # nothing the manifest lists. (Listed only now: an upload the killed worker had sent
    # may land after it died.)
    first_objects = [o.key for o in store.iter_objects(bucket, "jobfence/")
                     if f"/{first_attempt}/" in o.key]
    assert 0 < len(first_objects) < 150, len(first_objects)
    r = run_cli(dsn, "orphan-cleanup", JOBFENCE_ORPHAN_OBJECT_GRACE_SECONDS="0", **s3_env)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["orphaned_objects_deleted"] == len(first_objects)
    left = {f"s3://{bucket}/{o.key}" for o in store.iter_objects(bucket, "jobfence/")}
    assert left == {*item["outputs"], row["manifest"]}


def _children(dsn: str, parent: str) -> list[str]:
    from devtools.sqlconn import connect

    with connect(dsn) as conn:
        return [str(r["job_id"]) for r in conn.execute(
            "SELECT job_id FROM jobs WHERE parent_id = %s ORDER BY job_id", (parent,))]


def test_export_finalize_racing_the_last_childs_finalization(
        dsn: str, s3_env: dict[str, str]) -> None:
    url = put_inputs(s3_env, 3, prefix="race/")
    parent = enqueue_spec(dsn, s3_env, {"actions": [{"name": "sleep", "params": {
        "seconds": 0}}], "inputs": url})
    pid = str(parent["job_id"])
    assert run_cli(dsn, "worker", "--max-jobs", "2", **FAST, **s3_env).returncode == 0
    for _ in range(3):  # the last child's worker and two safety-net passes, all at once
        procs = [spawn(dsn, "worker", **s3_env),
                 spawn(dsn, "export-finalize", **s3_env),
                 spawn(dsn, "export-finalize", **s3_env)]
        for p in procs:
            p.communicate(timeout=60)
        assert [p.returncode for p in procs] == [0, 0, 0]
    assert job(dsn, pid)["status"] == "succeeded"
    terminal = [e for e in events(dsn, pid) if e["to_status"] in ("succeeded", "failed")]
    assert len(terminal) == 1


def test_cancelled_parent_leaves_no_child_running(dsn: str, s3_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    url = put_inputs(s3_env, 3, prefix="cancel/")
    script = f"echo $$ > {tmp_path}/pid.$JOBFENCE_JOB_ID; exec sleep 60"
    parent = enqueue_spec(dsn, s3_env, {"actions": [{"name": "command", "params": {
        "argv": ["sh", "-c", script]}}], "inputs": url})
    pid = str(parent["job_id"])
    worker = spawn(dsn, "worker", JOBFENCE_HEARTBEAT_SECONDS="0.3", **s3_env)
    wait_for(lambda: list(tmp_path.glob("pid.*")), timeout=20)
    child_pid = int(next(tmp_path.glob("pid.*")).read_text())
    r = run_cli(dsn, "cancel", pid, "--reason", "no longer needed")
    assert r.returncode == 0 and json.loads(r.stdout)["children_cancelled"] == 3
    worker.communicate(timeout=15)
    assert worker.returncode == 1
    status = json.loads(run_cli(dsn, "status", pid, "-o", "json").stdout)
    assert status["status"] == "cancelled"
    assert status["children"] == {"total": 3, "cancelled": 3}
    assert not os.path.exists(f"/proc/{child_pid}") or \
        open(f"/proc/{child_pid}/stat").read().split()[2] == "Z"


def test_grouped_datums_keep_names_relative_to_the_prefix(dsn: str,
                                                         s3_env: dict[str, str]) -> None:
    store, bucket = s3(s3_env), s3_env["JOBFENCE_S3_BUCKET"]
    for name in ("a.txt", "b.txt", "sub/c.txt", "sub/d.txt", "sub/e.txt"):
        store.put_bytes(bucket, f"grp/{name}", name.encode())
    listing = "cd \"$JOBFENCE_INPUT_DIR\" && find . -type f | sort > \"$JOBFENCE_OUTPUT_DIR/ls\""
    parent = enqueue_spec(dsn, s3_env, {"actions": [{"name": "command", "params": {
        "argv": ["sh", "-c", listing]}}], "inputs": {"url": f"s3://{bucket}/grp/",
                                                     "per_datum": 2}})
    assert parent["children"] == 3
    assert run_cli(dsn, "worker", "--max-jobs", "5", **FAST, **s3_env).returncode == 0
    assert run_cli(dsn, "export-finalize", **s3_env).returncode == 0
    row = job(dsn, str(parent["job_id"]))
    items = manifest(s3_env, row["manifest"])["items"]
    seen = sorted(store.get_bytes(*parse_s3_url(i["outputs"][0])).decode()  # type: ignore[index]
                  for i in items)  # type: ignore[union-attr]
    assert seen == ["./a.txt\n./b.txt\n", "./sub/c.txt\n./sub/d.txt\n", "./sub/e.txt\n"]


def test_enqueue_inputs_errors(dsn: str, s3_env: dict[str, str]) -> None:
    no_bucket = {k: v for k, v in s3_env.items() if k != "JOBFENCE_S3_BUCKET"}
    r = run_cli(dsn, "enqueue", "sleep:{\"seconds\": 0}", "--inputs",
                f"s3://{s3_env['JOBFENCE_S3_BUCKET']}/x/", **no_bucket)
    assert r.returncode == 2 and "JOBFENCE_S3_BUCKET" in r.stderr
    r = run_cli(dsn, "enqueue", "sleep:{\"seconds\": 0}", "--inputs",
                f"s3://{s3_env['JOBFENCE_S3_BUCKET']}/empty/", **s3_env)
    assert r.returncode == 2 and "matched no objects" in r.stderr
    r = run_cli(dsn, "enqueue", "sleep:{\"seconds\": 0}", "--inputs",
                "s3://no-such-bucket-here/x/", **s3_env)
    assert r.returncode == 5, r.stderr
    r = run_cli(dsn, "enqueue", "sleep:{\"seconds\": 0}", "--inputs", "/local/path", **s3_env)
    assert r.returncode == 2 and "s3://" in r.stderr
    assert json.loads(run_cli(dsn, "list", "-o", "json").stdout) == []


@pytest.mark.skipif(not hasattr(pty, "openpty"), reason="needs a pseudo-terminal")
def test_wait_on_a_parent_shows_children_progress_on_a_terminal(
        dsn: str, s3_env: dict[str, str]) -> None:
    url = put_inputs(s3_env, 4, prefix="tty/")
    parent = enqueue_spec(dsn, s3_env, {"actions": [{"name": "sleep", "params": {
        "seconds": 0}}], "inputs": url})
    assert run_cli(dsn, "worker", "--max-jobs", "4", **FAST, **s3_env).returncode == 0
    assert run_cli(dsn, "export-finalize", **s3_env).returncode == 0
    master, slave = pty.openpty()
    p = subprocess.Popen([*JOBFENCE, "wait", str(parent["job_id"])], cwd=REPO, stdin=slave,
                         stdout=slave, stderr=subprocess.PIPE, env=cli_env(dsn, "wait", **s3_env))
    _, err = p.communicate(timeout=30)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.returncode == 0, err
    assert b"4/4 children" in out and b"[####" in out


def test_children_inherit_the_queue_and_the_schedule(dsn: str, s3_env: dict[str, str]) -> None:
    """A datum job in the `datums` queue, delayed: every child is of `datums`, none runs
    before the parent's time, and a worker of `datums` drains them all."""
    url = put_inputs(s3_env, 6, prefix="sched/")
    parent = enqueue_spec(dsn, s3_env, {"actions": [{"name": "command", "params": {
        "argv": ["sh", "-c", UPPER]}}], "inputs": url, "queue": "datums", "delay": "PT6S"})
    children = _children(dsn, str(parent["job_id"]))
    assert len(children) == 6
    rows = [job(dsn, c) for c in children]
    assert {r["queue"] for r in rows} == {"datums"}
    assert all(r["run_at"] and r["run_at"].timestamp() > time.time() for r in rows)
    r = run_cli(dsn, "worker", "--queue", "datums", "--max-jobs", "20", **{**FAST, **s3_env})
    assert json.loads(r.stdout)["claimed"] == 0  # not yet
    default = run_cli(dsn, "worker", "--max-jobs", "20", **{**FAST, **s3_env})
    assert json.loads(default.stdout)["claimed"] == 0  # never: another queue
    wait_for(lambda: all(job(dsn, c)["run_at"].timestamp() < time.time() for c in children),
             timeout=10)
    r = run_cli(dsn, "worker", "--queue", "datums", "--max-jobs", "20", **{**FAST, **s3_env})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["succeeded"] == 6
    assert run_cli(dsn, "export-finalize", **s3_env).returncode == 0
    assert job(dsn, str(parent["job_id"]))["status"] == "succeeded"


def test_a_resumed_jobs_earlier_outputs_survive_orphan_cleanup(
        dsn: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    """Its first action published an output, its second failed once; the next attempt
    skipped the first: the job succeeded with the first attempt's output, which
    orphan-cleanup must keep, status list, and the datum manifest name."""
    once = tmp_path / "once"
    store, bucket = s3(s3_env), s3_env["JOBFENCE_S3_BUCKET"]
    made = enqueue_spec(dsn, s3_env, {
        "inputs": put_inputs(s3_env, 1), "max_attempts": 2, "actions": [
            {"name": "command", "params": {"argv": ["sh", "-c", UPPER]}},
            {"name": "command", "params": {"argv": [
                "sh", "-c", f"[ -e {once} ] || {{ touch {once}; exit 1; }}"]}}]})
    pid = str(made["job_id"])
    r = run_cli(dsn, "worker", "--max-jobs", "2", "--idle-seconds", "5", **FAST, **s3_env)
    assert r.returncode == 1, r.stderr  # the first attempt failed
    [child] = _children(dsn, pid)
    assert job(dsn, child)["status"] == "succeeded"
    assert job(dsn, child)["attempt_count"] == 2
    assert run_cli(dsn, "export-finalize", **s3_env).returncode == 0
    row = job(dsn, pid)
    [item] = manifest(s3_env, row["manifest"])["items"]  # type: ignore[misc]
    status = json.loads(run_cli(dsn, "status", child, "-o", "json", **s3_env).stdout)
    listed = [u for a in status["actions"] for u in (a.get("result") or {}).get("outputs", [])]
    assert len(listed) == 1 and item["outputs"] == listed
    r = run_cli(dsn, "orphan-cleanup", JOBFENCE_ORPHAN_OBJECT_GRACE_SECONDS="0", **s3_env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["orphaned_objects_deleted"] == 0
    left = {f"s3://{bucket}/{o.key}" for o in store.iter_objects(bucket, "jobfence/")}
    assert set(listed) <= left
    assert store.get_bytes(*parse_s3_url(listed[0])) == b"DATUM 0\n"


def test_an_http_submission_with_s3_inputs_splits_runs_and_finalizes(
        dsn: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    """POST /api/v1/jobs with `inputs`, as an application submits over HTTP: the answer is
    the parent with its children counted (as `enqueue` prints it), a bad inputs URL is a
    400 with nothing written, and the datums run and the parent is finalized with its
    manifest, as for the CLI."""
    from tests.support.serving import serve

    url = put_inputs(s3_env, 5, prefix="http-in/")
    spec = {"actions": [{"name": "command", "params": {"argv": ["sh", "-c", UPPER]}}],
            "inputs": {"url": url, "per_datum": 2}}
    with serve(dsn, JOBFENCE_AUTH="none", TMPDIR=str(tmp_path), **s3_env) as server:
        bad = server.post("/api/v1/jobs", {**spec, "inputs": "http://elsewhere/x"})
        assert bad.status == 400 and "s3://" in bad.body["error"], bad.body
        assert server.get("/api/v1/jobs").body["jobs"] == []
        r = server.post("/api/v1/jobs", spec)
        assert r.status == 202, r.body
        assert (r.body["status"], r.body["children"]) == ("running", 3)  # 5 inputs, 2 a child
        parent = str(r.body["job_id"])
        assert r.headers["location"] == f"/api/v1/jobs/{parent}"
        children = server.get(f"/api/v1/jobs?parent={parent}").body["jobs"]
        assert len(children) == 3 and {c["status"] for c in children} == {"pending"}
    ran = run_cli(dsn, "worker", "--max-jobs", "3", **{**FAST, **s3_env})
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert run_cli(dsn, "export-finalize", **s3_env).returncode == 0
    done = job(dsn, parent)
    assert done["status"] == "succeeded", done
    m = manifest(s3_env, done["manifest"])
    assert m["children"] == {"total": 3, "succeeded": 3}
    items = m["items"]
    assert isinstance(items, list)
    assert sorted(len(item["inputs"]) for item in items) == [1, 2, 2]
    outputs = [o for item in items for o in item["outputs"]]
    got = sorted(s3(s3_env).get_bytes(*parse_s3_url(o)).decode() for o in outputs)
    assert got == [f"DATUM {i}\n" for i in range(5)]
