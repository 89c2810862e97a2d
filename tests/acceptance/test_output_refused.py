"""An output the object store refuses to take, through the real worker against moto's S3
server with a bucket policy that denies the upload (no mock of boto3): that output is
marked ``error`` with the store's reason, the one it took is ``done``, the attempt fails
saying how many outputs failed, and nothing the attempt wrote becomes a committed output."""

from __future__ import annotations

import json

from devtools.sqlconn import connect
from jobfence.adapters.s3 import S3ObjectStore
from jobfence.objectstore import attempt_prefix
from jobfence.store import Store
from tests.support import run_cli
from tests.support.procs import FAST, enqueue, job


def test_an_output_the_object_store_refuses_is_marked_error(
        dsn: str, s3_env: dict[str, str]) -> None:
    write = ('echo kept > "$JOBFENCE_OUTPUT_DIR/good.txt"; '
             'echo refused > "$JOBFENCE_OUTPUT_DIR/refused.txt"')
    job_id = enqueue(dsn, "command:" + json.dumps({"argv": ["sh", "-c", write]}),
                     "--max-attempts", "1", **s3_env)
    s3, bucket = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"]), \
        s3_env["JOBFENCE_S3_BUCKET"]
    s3.client.put_bucket_policy(Bucket=bucket, Policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
            "Resource": f"arn:aws:s3:::{bucket}/*/refused.txt"}]}))
    r = run_cli(dsn, "worker", **FAST, **s3_env)
    assert r.returncode == 1, r.stderr
    row = job(dsn, job_id)
    assert row["status"] == "failed"
    assert "1 of 2 outputs failed to upload, first: refused.txt" in row["error"]
    assert "PutObject operation: Forbidden" in row["error"]
    with connect(dsn) as conn:
        outputs = {o["path"]: o for o in conn.execute(
            "SELECT path, status, error, size_bytes, attempt_id FROM job_outputs "
            "WHERE job_id = %s", (job_id,))}
        installation = str(Store(conn).control.identity().installation)
    assert set(outputs) == {"good.txt", "refused.txt"}
    assert (outputs["good.txt"]["status"], outputs["good.txt"]["size_bytes"]) == ("done", 5)
    refused = outputs["refused.txt"]
    assert (refused["status"], refused["size_bytes"]) == ("error", None)
    assert "(403)" in refused["error"] and "Forbidden" in refused["error"]
    prefix = attempt_prefix(installation, row["job_id"], refused["attempt_id"])
    assert [o.key for o in s3.iter_objects(bucket, prefix)] == [prefix + "good.txt"]
    shown = json.loads(run_cli(dsn, "status", job_id, "-o", "json").stdout)
    [action] = shown["actions"]
    assert action["status"] == "failed" and "outputs failed to upload" in action["error"]
