"""Function runs record themselves (trigger, status, counts, duration) and their metrics come
from the database: counters that add up across runs and pods, a last success that survives a
failed run, queue gauges. Checked in the Prometheus text format with the client's own parser
(`jobfence metrics`), and against a real Pushgateway when its binary is installed."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.embedded_pg import free_port
from devtools.sqlconn import connect
from jobfence.adapters.s3 import S3ObjectStore
from jobfence.passes.harness import detect_trigger
from jobfence.settings import Settings
from jobfence.store import Store
from tests.support import REPO, run_cli
from tests.support.factories import run_in_progress
from tests.support.manifests import METRICS
from tests.support.procs import enqueue, wait_for

BROKEN_CLUSTER = {"JOBFENCE_CLUSTER": "kubernetes", "KUBECONFIG": "/nonexistent",
                  "KUBERNETES_SERVICE_HOST": ""}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k not in ("job", "instance")))
            out[(s.name, labels)] = s.value
    return out


def test_runs_record_trigger_counts_and_status_and_metrics_add_up(dsn: str) -> None:
    assert run_cli(dsn, "sweeper").returncode == 0
    assert run_cli(dsn, "sweeper", JOBFENCE_TRIGGER="manual").returncode == 0
    assert run_cli(dsn, "reconciliation").returncode == 0
    failed = run_cli(dsn, "reconciliation", **BROKEN_CLUSTER)
    assert failed.returncode == 1, failed.stderr
    with connect(dsn) as conn:
        runs = conn.execute("SELECT function, trigger, status, counts FROM function_runs "
                            "ORDER BY run_id").fetchall()
    assert [(r["function"], r["trigger"], r["status"]) for r in runs] == [
        ("sweeper", "scheduled", "succeeded"), ("sweeper", "manual", "succeeded"),
        ("reconciliation", "scheduled", "succeeded"), ("reconciliation", "scheduled", "failed")]
    assert runs[0]["counts"]["reclaimed"] == 0
    nap = 'sleep:{"seconds": 1}'
    enqueue(dsn, nap)
    enqueue(dsn, nap, "--after", enqueue(dsn, nap))
    r = run_cli(dsn, "metrics")
    assert r.returncode == 0, r.stderr
    got = samples(r.stdout)
    assert got[("jobfence_function_runs_total",
                (("function", "sweeper"), ("status", "succeeded")))] == 2
    assert got[("jobfence_function_runs_total",
                (("function", "reconciliation"), ("status", "failed")))] == 1
    assert got[("jobfence_function_items_total",  # two runs: reclaims, stopping attempts
                (("function", "sweeper"), ("item", "batches")))] == 4
    # The failed run did not erase reconciliation's last success.
    last = got[("jobfence_function_last_success_timestamp_seconds",
                (("function", "reconciliation"),))]
    assert abs(last - time.time()) < 120
    assert got[("jobfence_jobs", (("queue", "default"), ("status", "pending")))] == 2
    assert got[("jobfence_jobs", (("queue", "default"), ("status", "waiting")))] == 1
    assert got[("jobfence_queue_oldest_ready_age_seconds", (("queue", "default"),))] >= 0
    assert got[("jobfence_draining", ())] == 0
    # Every queue with work or settings has its own series.
    enqueue(dsn, nap, "--queue", "reports", "--delay", "PT1H")
    assert run_cli(dsn, "queue", "pause", "reports").returncode == 0
    assert run_cli(dsn, "queue", "limit", "exports", "3").returncode == 0
    got = samples(run_cli(dsn, "metrics").stdout)
    assert got[("jobfence_jobs", (("queue", "reports"), ("status", "pending")))] == 1
    assert got[("jobfence_jobs_scheduled", (("queue", "reports"),))] == 1
    assert got[("jobfence_queue_paused", (("queue", "reports"),))] == 1
    assert got[("jobfence_queue_paused", (("queue", "default"),))] == 0
    assert got[("jobfence_queue_limit", (("queue", "exports"),))] == 3
    assert ("jobfence_queue_limit", (("queue", "default"),)) not in got
    assert run_cli(dsn, "queue", "rate", "exports", "10/PT30S").returncode == 0
    got = samples(run_cli(dsn, "metrics").stdout)
    assert got[("jobfence_queue_rate_limit", (("queue", "exports"),))] == 10
    assert got[("jobfence_queue_rate_period_seconds", (("queue", "exports"),))] == 30
    assert got[("jobfence_queue_rate_started", (("queue", "exports"),))] == 0
    assert ("jobfence_queue_rate_limit", (("queue", "default"),)) not in got


def test_skipped_run_is_recorded_and_counted(dsn: str) -> None:

    with connect(dsn) as holder:
        run_in_progress(Store(holder), "sweeper")
        assert run_cli(dsn, "sweeper").returncode == 0
    got = samples(run_cli(dsn, "metrics").stdout)
    assert got[("jobfence_function_runs_total",
                (("function", "sweeper"), ("status", "skipped")))] == 1


def test_trigger_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No function reads the Kubernetes API to know its trigger: a pod's run is scheduled
    unless started with JOBFENCE_TRIGGER=manual."""
    s = Settings(database_url="postgresql://x@localhost/x", cluster="kubernetes")
    monkeypatch.setenv("POD_NAME", "sweep-29384756-abcde")
    assert detect_trigger(s) == "scheduled"
    assert detect_trigger(s.model_copy(update={"trigger": "manual"})) == "manual"


@contextlib.contextmanager
def pushgateway() -> Iterator[str]:
    binary = shutil.which("prometheus-pushgateway") or "/usr/bin/prometheus-pushgateway"
    if not shutil.which(binary):
        pytest.skip("prometheus-pushgateway is not installed (the exposition format is "
                    "checked by the parser test above)")
    port = free_port()
    # A persistence file of its own: Debian's build keeps one in /var/lib by default, so a
    # fresh gateway would start with an earlier one's groups.
    store = tempfile.mkdtemp(prefix="jobfence-pushgateway-")
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}",
                             f"--persistence.file={store}/metrics"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(url + "/-/ready") is not None, timeout=15)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(store, ignore_errors=True)


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def test_functions_push_to_a_real_pushgateway_and_keep_the_last_success(dsn: str) -> None:
    with pushgateway() as url:
        env = {"JOBFENCE_PUSHGATEWAY_URL": url}
        assert run_cli(dsn, "reconciliation", **env).returncode == 0
        first = samples(_get(url + "/metrics") or "")
        key = ("jobfence_function_last_success_timestamp_seconds",
               (("function", "reconciliation"),))
        assert key in first
        assert run_cli(dsn, "reconciliation", **env, **BROKEN_CLUSTER).returncode == 1
        assert run_cli(dsn, "sweeper", **env).returncode == 0
        after = samples(_get(url + "/metrics") or "")
        assert after[key] == first[key]  # kept across the failed run
        assert after[("jobfence_function_runs_total",
                      (("function", "reconciliation"), ("status", "failed")))] == 1
        assert after[("jobfence_function_runs_total",
                      (("function", "sweeper"), ("status", "succeeded")))] == 1
        # Queue gauges live in their own group, one series whichever function pushed.
        assert after[("jobfence_jobs", (("function", "queue"), ("queue", "default"),
                                        ("status", "pending")))] == 0
    # Beside the metrics exporter, the functions push only their own run metrics.
    with pushgateway() as url:
        env = {"JOBFENCE_PUSHGATEWAY_URL": url, "JOBFENCE_PUSH_QUEUE_METRICS": "false"}
        assert run_cli(dsn, "sweeper", **env).returncode == 0
        pushed = {name for name, _ in samples(_get(url + "/metrics") or "")}
        assert "jobfence_function_runs_total" in pushed
        leaked = pushed & {"jobfence_jobs", "jobfence_jobs_finished_total",
                           "jobfence_metrics_collected_timestamp_seconds"}
        assert not leaked, leaked


def test_health_goes_to_zero_after_three_failed_runs_and_back_on_a_success(dsn: str) -> None:
    def health() -> tuple[float, float]:
        got = samples(run_cli(dsn, "metrics").stdout)
        key = (("function", "reconciliation"),)
        return (got[("jobfence_function_health", key)],
                got[("jobfence_function_consecutive_failures", key)])

    assert run_cli(dsn, "reconciliation", JOBFENCE_CLUSTER="local").returncode == 0
    assert health() == (1, 0)
    for n in (1, 2):
        assert run_cli(dsn, "reconciliation", **BROKEN_CLUSTER).returncode == 1
        assert health() == (1, n)
    with connect(dsn) as holder:  # a skipped run is neither a failure nor a success
        holder_id = run_in_progress(Store(holder), "reconciliation")
        assert run_cli(dsn, "reconciliation", JOBFENCE_CLUSTER="local").returncode == 0
        assert health() == (1, 2)
        holder.execute("DELETE FROM function_leases WHERE holder = %s", (holder_id,))
    assert run_cli(dsn, "reconciliation", **BROKEN_CLUSTER).returncode == 1
    assert health() == (0, 3)
    assert run_cli(dsn, "reconciliation", JOBFENCE_CLUSTER="local").returncode == 0
    assert health() == (1, 0)


def test_a_snapshot_reads_its_last_value_never_a_sum(dsn: str) -> None:
    with connect(dsn) as conn:
        runs = Store(conn).runs
        for seen in (5, 3):
            runs.run_finished(run_id=0, function="orphan-cleanup", trigger="scheduled",
                              status="succeeded", counts={"orphan_suspects": seen,
                                                          "orphaned_pods_cleaned": 1},
                              duration_seconds=0.1, gauges={"orphan_suspects"})
        runs.run_finished(run_id=0, function="orphan-cleanup", trigger="scheduled",
                          status="failed", counts={}, duration_seconds=0.1)
    got = samples(run_cli(dsn, "metrics").stdout)
    fn = ("function", "orphan-cleanup")
    assert got[("jobfence_function_snapshot", (fn, ("item", "orphan_suspects")))] == 3
    assert got[("jobfence_function_items_total", (fn, ("item", "orphaned_pods_cleaned")))] == 2
    assert ("jobfence_function_items_total", (fn, ("item", "orphan_suspects"))) not in got
    # The functions' own reports say which of their counts are snapshots.
    assert run_cli(dsn, "reconciliation", JOBFENCE_CLUSTER="local").returncode == 0
    assert run_cli(dsn, "reconciliation", JOBFENCE_CLUSTER="local").returncode == 0
    got = samples(run_cli(dsn, "metrics").stdout)
    rec = ("function", "reconciliation")
    assert ("jobfence_function_snapshot", (rec, ("item", "pods_listed"))) in got
    assert ("jobfence_function_items_total", (rec, ("item", "pods_listed"))) not in got
    assert got[("jobfence_metrics_collected_timestamp_seconds", ())] == pytest.approx(
        time.time(), abs=120)


def test_runs_shows_recent_runs_with_who_and_why_for_a_manual_one(dsn: str) -> None:
    assert run_cli(dsn, "sweeper").returncode == 0
    assert run_cli(dsn, "reconciliation", **BROKEN_CLUSTER).returncode == 1
    by_hand = run_cli(dsn, "lifecycle", JOBFENCE_TRIGGERED_BY="ana@example.com",
                      JOBFENCE_TRIGGER_REASON="INC-42: retention backlog")
    assert by_hand.returncode == 0, by_hand.stderr
    r = run_cli(dsn, "runs", "-o", "json")
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)
    assert [(x["function"], x["status"], x["trigger"]) for x in runs] == [
        ("lifecycle", "succeeded", "manual"), ("reconciliation", "failed", "scheduled"),
        ("sweeper", "succeeded", "scheduled")]
    assert runs[0]["triggered_by"] == "ana@example.com"
    assert runs[0]["trigger_reason"] == "INC-42: retention backlog"
    assert runs[1]["error"] and runs[2]["counts"]["reclaimed"] == 0
    assert runs[2]["duration_seconds"] >= 0
    text = run_cli(dsn, "runs", "--function", "lifecycle").stdout
    assert "manual by ana@example.com: INC-42: retention backlog" in text
    failed = json.loads(run_cli(dsn, "runs", "--status", "failed", "-o", "json").stdout)
    assert [x["function"] for x in failed] == ["reconciliation"]
    assert run_cli(dsn, "runs", "--limit", "0").returncode == 2


def test_metrics_exports_exactly_the_names_alerts_and_dashboards_may_use(
        dsn: str, s3_env: dict[str, str]) -> None:
    enqueue(dsn, 'command:{"argv": ["true"]}')
    assert run_cli(dsn, "worker").returncode == 0
    # An action stopped for going quiet (jobfence_job_stops_total).
    enqueue(dsn, 'command:{"argv": ["sleep", "30"]}', "--inactivity-timeout", "PT1S",
            "--max-attempts", "1")
    assert run_cli(dsn, "worker").returncode == 1
    # An action whose result reports its usage (a plugin's, as a command's may).
    plugin = {"PYTHONPATH": str(REPO / "tests" / "fixtures" / "plugin")}
    enqueue(dsn, 'report:{"result": {"usage": {"cpu_seconds": 0.2, '
                 '"peak_memory_bytes": 5000000}}}', "--queue", "plugins", **plugin)
    assert run_cli(dsn, "worker", "--queue", "plugins", **plugin).returncode == 0
    assert run_cli(dsn, "queue", "limit", "default", "5").returncode == 0
    assert run_cli(dsn, "queue", "rate", "default", "100/minute").returncode == 0
    assert run_cli(dsn, "orphan-cleanup", JOBFENCE_CLUSTER="local").returncode == 0
    # A job that expires before a worker comes (lifecycle's lag), and a datum parent
    # finalized after its one child (the finalization lag).
    enqueue(dsn, 'sleep:{"seconds": 0}', "--queue", "idle", "--expires-in", "PT0.2S")
    bucket = s3_env["JOBFENCE_S3_BUCKET"]
    S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"]).put_bytes(
        bucket, "in/one.txt", b"datum\n")
    enqueue(dsn, 'sleep:{"seconds": 0}', "--inputs", f"s3://{bucket}/in/", **s3_env)
    assert run_cli(dsn, "worker", **s3_env).returncode == 0
    time.sleep(0.3)
    assert run_cli(dsn, "lifecycle").returncode == 0
    assert run_cli(dsn, "export-finalize", **s3_env).returncode == 0
    assert run_cli(dsn, "sweeper").returncode == 0
    names = {s.name for f in text_string_to_metric_families(run_cli(dsn, "metrics").stdout)
             for s in f.samples}
    # jobfence_database_up comes from the exporter's own scrape (test_prometheus.py).
    assert names | {"jobfence_database_up"} == METRICS


def test_the_connection_gauges_move_as_connections_are_taken(dsn: str) -> None:
    """The saturation signal (JobfenceDatabaseConnectionsNearLimit) as the reader role reads
    it: ten connections taken show as ten more in use, and go when they are closed."""
    def in_use() -> float:
        got = samples(run_cli(dsn, "metrics").stdout)
        return got[("jobfence_database_connections", ())]

    def steady() -> float | None:
        first, second = in_use(), in_use()
        return first if first == second else None  # no connection of an earlier test ending

    before = wait_for(steady)
    held = [connect(dsn) for _ in range(10)]
    try:
        during = in_use()
        assert during >= before + 10
        with connect(dsn) as conn:
            row = conn.execute("SELECT current_setting('max_connections')::int - "
                               "current_setting('superuser_reserved_connections')::int "
                               "AS allowed").fetchone()
        got = samples(run_cli(dsn, "metrics").stdout)
        assert row is not None
        assert got[("jobfence_database_connections_available", ())] == row["allowed"]
    finally:
        for conn in held:
            conn.close()
    wait_for(lambda: in_use() <= during - 10)
