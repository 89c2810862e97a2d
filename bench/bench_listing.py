"""Listing S3 inputs: `enqueue --inputs` over 10k and 100k objects (moto's S3 server on
127.0.0.1). Children are made page by page from the listing and inserted in batches, so the
enqueue process's peak memory must stay flat as the count grows (target < 150 MB). The
reference is `python -c "import boto3, psycopg"`, the floor any such process pays."""

from __future__ import annotations

import json
import sys

from bench.common import JOBFENCE, Bench, Section, peak_rss_mb
from devtools.s3 import moto_server

BUCKET = "bench-inputs"


def fill(endpoint: str, prefix: str, n: int) -> None:
    """Put n tiny objects straight into moto's in-process backend (the HTTP API would
    take minutes for 100k); the enqueue under test still lists them over HTTP."""
    import boto3
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    existing = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
    if BUCKET not in existing:
        client.create_bucket(Bucket=BUCKET)
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for i in range(n):
        backend.put_object(BUCKET, f"{prefix}{i:07d}.txt", b"x")


def run(bench: Bench) -> Section:
    sizes = [1_000, 10_000] if bench.quick else [10_000, 100_000]
    s = Section("Listing S3 inputs into datums (peak memory)",
                "python -m bench.run --only listing",
                ["inputs", "children/s", "peak RSS", "baseline (imports only)", "vs baseline",
                 "target"])
    with moto_server() as endpoint:
        s3env = {"JOBFENCE_S3_ENDPOINT_URL": endpoint, "JOBFENCE_S3_BUCKET": BUCKET,
                 "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        code, _, base_mb, _, err = peak_rss_mb(
            [sys.executable, "-c", "import boto3, psycopg"], bench.env("", **s3env))
        for n in sizes:
            dsn = bench.database()
            prefix = f"in-{n}/"
            fill(endpoint, prefix, n)
            spec = {"actions": [{"name": "command", "params": {"argv": ["true"]}}],
                    "inputs": f"s3://{BUCKET}/{prefix}"}
            code, secs, mb, out, err = peak_rss_mb(
                [*JOBFENCE, "enqueue", "--spec", "-"], bench.env(dsn, **s3env),
                input=json.dumps(spec).encode())
            if code != 0:
                raise RuntimeError(f"enqueue failed: {err.decode()[-2000:]}")
            children = json.loads(out)["children"]
            assert children == n, (children, n)
            s.rows.append([f"{n:,}", f"{n / secs:,.0f}", f"{mb:.0f} MB", f"{base_mb:.0f} MB",
                           f"{mb / base_mb:.2f}×", "< 150 MB, flat"])
    s.notes.append("Children/s includes moto's own listing cost (one HTTP page per 1,000 keys).")
    return s
