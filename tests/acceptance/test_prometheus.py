"""A real Prometheus (Debian's `prometheus`, on 127.0.0.1) scrapes `jobfence metrics
--serve` after a run of jobs and shows the job counters and histograms with the values the
audit trail says."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from devtools.embedded_pg import free_port
from devtools.sqlconn import connect
from tests.support import JOBFENCE, REPO, cli_env, run_cli
from tests.support.procs import FAST, enqueue, kill_quietly

PROMETHEUS = shutil.which("prometheus")

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Prometheus is not installed "
                                "(Debian's `prometheus`; .ci/run installs it)")


def query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_prometheus_scrapes_the_job_metrics_the_audit_trail_says(dsn: str,
                                                                 tmp_path: Path) -> None:
    ok = 'command:{"argv": ["true"]}'
    for _ in range(3):
        enqueue(dsn, ok)
    enqueue(dsn, 'command:{"argv": ["false"]}', "--max-attempts", "2")
    enqueue(dsn, ok, "--queue", "reports")
    for queue in ("default", "reports"):
        r = run_cli(dsn, "worker", "--queue", queue, "--max-jobs", "10", **FAST)
        assert r.returncode in (0, 1), r.stderr
    assert run_cli(dsn, "sweeper").returncode == 0  # a pass folds the job metrics
    with connect(dsn) as conn:
        claims = conn.execute("SELECT count(*) AS n FROM job_events WHERE "
                              "from_status = 'pending' AND to_status = 'running'"
                              ).fetchone()["n"]
    exporter = subprocess.Popen(
        [*JOBFENCE, "metrics", "--serve", "--host", "127.0.0.1", "--port", "0"],
        env=cli_env(dsn, "metrics"), cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    prometheus = None
    try:
        assert exporter.stdout is not None
        target = json.loads(exporter.stdout.readline())["serving"]
        hostport = target.split("//")[1].split("/")[0]
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: jobfence\n    static_configs: [{{targets: ['{hostport}']}}]\n")
        port = free_port()
        prometheus = subprocess.Popen(
            [str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        finished: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                finished = query(base, "jobfence_jobs_finished_total")
            except OSError:
                finished = []
            if finished:
                break
            time.sleep(0.5)
        assert finished, "Prometheus never scraped the exporter"
        got = {(s["metric"]["queue"], s["metric"]["status"]): float(s["value"][1])
               for s in finished}
        assert got == {("default", "succeeded"): 3, ("default", "failed"): 1,
                       ("reports", "succeeded"): 1}
        attempts = {(s["metric"]["queue"], s["metric"]["outcome"]): float(s["value"][1])
                    for s in query(base, "jobfence_job_attempts_total")}
        assert attempts == {("default", "succeeded"): 3, ("default", "retried"): 1,
                            ("default", "failed"): 1, ("reports", "succeeded"): 1}
        waits = query(base, "sum(jobfence_job_wait_seconds_count)")
        assert float(waits[0]["value"][1]) == claims == 6
        runs = query(base, 'jobfence_job_run_seconds_bucket{le="+Inf"}')
        assert {s["metric"]["queue"]: float(s["value"][1]) for s in runs} == {
            "default": 4, "reports": 1}
        p95 = query(base, "histogram_quantile(0.95, sum by (le) "
                          "(jobfence_job_wait_seconds_bucket))")
        assert p95 and float(p95[0]["value"][1]) >= 0
        assert float(query(base, "jobfence_database_up")[0]["value"][1]) == 1
    finally:
        if prometheus is not None:
            kill_quietly(prometheus)
        exporter.terminate()
        _, err = exporter.communicate(timeout=10)
        assert exporter.returncode == 0, err  # SIGTERM: a clean stop
