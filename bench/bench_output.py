"""A command's output and usage, what they cost the worker: the same jobs run by the same
worker (two processes of ten slots, as the datums pool ships), side by side in one run.

- **Streaming**: a chatty command (20,000 lines, 1.3 MB on stdout) with its output streamed
  as shipped — line by line to the worker's log (200 lines a second per worker) and whole to
  S3 (moto's server on 127.0.0.1) — against the same with both turned off
  (`JOBFENCE_OUTPUT_LINES_PER_SECOND=0`, `JOBFENCE_OUTPUT_MAX_BYTES=0`: tails only).
- **Usage accounting**: a short command (`true`) with its tree's memory sampled as shipped
  (`JOBFENCE_USAGE_SAMPLE_SECONDS=0.5`) against sampling off (0); the CPU time and the
  largest process come from `wait4` either way, at no cost of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from bench.common import JOBFENCE, REPO, Bench, Section
from devtools.s3 import moto_server

BUCKET = "bench-output"
CHATTY = [sys.executable, "-c",
          "import sys\nw = sys.stdout.write\nfor i in range(20000): w(f'{i:063d}\\n')"]


def _round(bench: Bench, argv: list[str], jobs: int, **env: str) -> float:
    """Jobs a second: ``jobs`` commands drained by two workers of ten slots."""
    dsn = bench.database()
    e = bench.env(dsn, **env)
    specs = [{"actions": [{"name": "command", "params": {"argv": argv}}]}] * jobs
    subprocess.run([*JOBFENCE, "enqueue", "--spec", "-"], env=e, cwd=REPO, check=True,
                   input=json.dumps(specs).encode(), capture_output=True, timeout=600)
    started = time.monotonic()
    workers = [subprocess.Popen([*JOBFENCE, "worker", "--concurrency", "10",
                                 "--max-jobs", str(jobs)], env=e, cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(2)]
    for w in workers:
        w.wait(timeout=1800)
    return jobs / (time.monotonic() - started)


def run(bench: Bench) -> Section:
    jobs = 100 if bench.quick else 400
    s = Section("A command's output and usage: what they cost the worker",
                "python -m bench.run --only output",
                ["jobs", "as shipped", "turned off", "ratio (shipped / off)"])
    with moto_server() as endpoint:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket=BUCKET)
        s3 = {"JOBFENCE_S3_ENDPOINT_URL": endpoint, "JOBFENCE_S3_BUCKET": BUCKET,
              "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        on, off = [], []
        for _ in range(2):  # alternated, so that the machine's drift falls on both
            on.append(_round(bench, CHATTY, jobs, **s3))
            off.append(_round(bench, CHATTY, jobs, **s3, JOBFENCE_OUTPUT_LINES_PER_SECOND="0",
                              JOBFENCE_OUTPUT_MAX_BYTES="0"))
        s.rows.append([f"{jobs} chatty commands (20,000 lines each), jobs/s",
                       f"{max(on):.1f}", f"{max(off):.1f}", f"{max(on) / max(off):.2f}×"])
        lines_only = _round(bench, CHATTY, jobs, **s3, JOBFENCE_OUTPUT_MAX_BYTES="0")
        s3_only = _round(bench, CHATTY, jobs, **s3, JOBFENCE_OUTPUT_LINES_PER_SECOND="0")
        s.rows.append(["— of which: log lines only (no S3)", f"{lines_only:.1f}",
                       f"{max(off):.1f}", f"{lines_only / max(off):.2f}×"])
        s.rows.append(["— of which: S3 only (no log lines)", f"{s3_only:.1f}",
                       f"{max(off):.1f}", f"{s3_only / max(off):.2f}×"])
        sampled, unsampled = [], []
        for _ in range(2):
            sampled.append(_round(bench, ["true"], jobs * 2))
            unsampled.append(_round(bench, ["true"], jobs * 2,
                                    JOBFENCE_USAGE_SAMPLE_SECONDS="0"))
        s.rows.append([f"{jobs * 2} short commands (`true`), jobs/s", f"{max(sampled):.1f}",
                       f"{max(unsampled):.1f}", f"{max(sampled) / max(unsampled):.2f}×"])
    s.notes.append(
        "Best of two alternated rounds each; two worker processes of ten slots. Streaming "
        "as shipped writes each job's 1.3 MB stdout to S3 (an object, registered under the "
        "fence first) and up to 200 of its lines a second to the worker's log; turned off, "
        "only the tails stay. The split rows (one round each) say where the cost is; the S3 "
        "server here is moto, a Python process on the same two cores, so its share is an "
        "upper bound of what a real S3 costs the worker's machine. Usage: the tree's memory "
        "sampled every 0.5 s against never (a `true` ends before the first sample is due, so this is the cost of the `wait4` "
        "loop and the bookkeeping; a long command pays one /proc read of its tree per "
        "sample).")
    return s
