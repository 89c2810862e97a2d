"""What a short-lived command loads before it reaches the database: the worker and enqueue
(the commands KEDA and applications start most often) and a periodic function, run as the
real CLI in a fresh interpreter up to their first connection (a port nothing listens on:
exit 4), do not import the heavy clients they are not configured to use — Kubernetes, S3,
OpenTelemetry, Prometheus, the HTTP server — nor structlog and its console renderer, which
the JSON log format does without. A boundary, not a timing: the time is measured by
``bench/bench_coldstart.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO

NOT_AT_START = ("kubernetes", "boto3", "botocore", "s3transfer", "opentelemetry",
                "prometheus_client", "structlog", "rich", "starlette", "uvicorn", "yaml",
                "cronsim", "urllib3", "requests", "moto")

PROBE = r"""
import atexit, json, sys
from jobfence.functions import cli
atexit.register(lambda: print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})),
                              file=sys.__stdout__))
sys.argv = ["jobfence", *sys.argv[1:]]
cli.run()
"""


def loaded(*argv: str) -> tuple[int, set[str], str]:
    """The exit code, the top-level modules loaded and stderr of ``jobfence ARGV`` run as
    far as the database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBFENCE_", "OTEL_"))}
    env.update(JOBFENCE_DATABASE_URL="postgresql://127.0.0.1:9/none",
               JOBFENCE_CONNECT_TIMEOUT_SECONDS="1")
    r = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    modules = json.loads(r.stdout.strip().splitlines()[-1])
    return r.returncode, set(modules), r.stderr


@pytest.mark.parametrize("argv", [["worker"], ["worker", "--max-jobs", "1000",
                                               "--concurrency", "10"],
                                  ["enqueue", "sleep:{\"seconds\": 0}"], ["sweeper"]])
def test_a_command_imports_no_client_it_does_not_use(argv: list[str]) -> None:
    code, modules, stderr = loaded(*argv)
    assert code == 4, stderr  # it ran as far as the database
    assert "psycopg" in modules and "jobfence" in modules
    assert sorted(modules & set(NOT_AT_START)) == [], stderr

