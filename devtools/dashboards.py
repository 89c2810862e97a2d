"""The Grafana dashboards, written as JSON into
manifests/components/grafana-dashboards/dashboards/ (`make dashboards`; a test keeps the
files and this source in step). Each dashboard picks its Prometheus with a `datasource`
variable, and every panel's expressions name only metrics jobfence exports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "manifests" / "components" / \
    "grafana-dashboards" / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend}


def panel(title: str, exprs: list[tuple[str, str]], *, unit: str = "short",
          kind: str = "timeseries", width: int = 12, description: str = "") -> dict[str, Any]:
    return {"type": kind, "title": title, "description": description, "datasource": DS,
            "targets": [target(e, legend, chr(ord("A") + i))
                        for i, (e, legend) in enumerate(exprs)],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {}, "gridPos": {"w": width, "h": 8}}


def quantiles(metric: str, selector: str, by: str = "queue") -> list[tuple[str, str]]:
    """p50, p95 and p99 of a histogram, one series per value of the ``by`` labels."""
    legend = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(","))
    matchers = f"{{{selector}}}" if selector else ""
    return [(f"histogram_quantile({q}, sum by ({by}, le) "
             f"(rate({metric}_bucket{matchers}[{RATE}])))", f"p{int(q * 100)} {legend}")
            for q in (0.5, 0.95, 0.99)]


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]],
              variables: list[dict[str, Any]]) -> dict[str, Any]:
    x = y = 0
    for i, p in enumerate(panels, start=1):
        p["id"] = i
        w = p["gridPos"]["w"]
        if x + w > 24:
            x, y = 0, y + 8
        p["gridPos"].update({"x": x, "y": y})
        x += w
    return {
        "uid": uid, "title": title, "description": description, "tags": ["jobfence"],
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "timezone": "utc",
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            *variables]},
        "panels": panels,
    }


def variable(name: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": name, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"text": "All", "value": "$__all"}, "refresh": 2, "sort": 1}


def overview() -> dict[str, Any]:
    q = 'queue=~"$queue"'
    a = 'action=~"$action"'
    return dashboard(
        "jobfence-overview", "jobfence — jobs",
        "Jobs by queue: how many finish and how, how long they wait and run, what waits; "
        "actions by queue and action: runs, run time, CPU and memory.",
        [
            panel("Jobs finished per second, by status", [
                (f"sum by (status) (rate(jobfence_jobs_finished_total{{{q}}}[{RATE}]))",
                 "{{status}}")], unit="ops"),
            panel("Success rate, by queue", [
                (f'sum by (queue) (rate(jobfence_jobs_finished_total{{{q}, '
                 f'status="succeeded"}}[{RATE}])) / sum by (queue) '
                 f"(rate(jobfence_jobs_finished_total{{{q}}}[{RATE}]))", "{{queue}}")],
                unit="percentunit"),
            panel("Failed jobs per second, by queue", [
                (f'sum by (queue) (rate(jobfence_jobs_finished_total{{{q}, '
                 f'status="failed"}}[{RATE}]))', "{{queue}}")], unit="ops"),
            panel("Attempts ended per second, by outcome", [
                (f"sum by (outcome) (rate(jobfence_job_attempts_total{{{q}}}[{RATE}]))",
                 "{{outcome}}")], unit="ops",
                description="retried: given back after a failure; interrupted: SIGTERM; "
                            "lost: the fence was taken (lease expired, pod gone)."),
            panel("Actions stopped per second, by queue and why", [
                (f"sum by (queue, why) (rate(jobfence_job_stops_total{{{q}}}[{RATE}]))",
                 "{{queue}} {{why}}")], unit="ops",
                description="inactive: no output or progress for the action's inactivity "
                            "timeout (a command that hangs quietly); timed_out: past the "
                            "job's timeout. Each is also an attempt retried or failed."),
            panel("Wait time (ready → claimed), p50 / p95 / p99",
                  quantiles("jobfence_job_wait_seconds", q), unit="s"),
            panel("Run time (claimed → terminal), p50 / p95 / p99",
                  quantiles("jobfence_job_run_seconds", q), unit="s"),
            panel("Action runs per second, by action and outcome", [
                (f"sum by (action, outcome) (rate(jobfence_action_runs_total{{{q}, {a}}}"
                 f"[{RATE}]))", "{{action}} {{outcome}}")], unit="ops",
                description="Every action whose outcome a worker stored; an action name no "
                            "worker registered counts as other."),
            panel("Action run time, by action, p50 / p95 / p99",
                  quantiles("jobfence_action_run_seconds", f"{q}, {a}", by="action"),
                  unit="s"),
            panel("CPU seconds per action run, by action, p50 / p95 / p99",
                  quantiles("jobfence_action_cpu_seconds", f"{q}, {a}", by="action"),
                  unit="s", description="What the action's result reports (usage.cpu_seconds): "
                                        "a command's user and system time."),
            panel("Peak memory per action run, by action, p50 / p95 / p99",
                  quantiles("jobfence_action_peak_memory_bytes", f"{q}, {a}", by="action"),
                  unit="bytes", description="What the action's result reports "
                                            "(usage.peak_memory_bytes)."),
            panel("Jobs by queue and status (now)", [
                (f"sum by (queue, status) (jobfence_jobs{{{q}}})", "{{queue}} {{status}}")]),
            panel("Oldest ready job's age, by queue", [
                (f"jobfence_queue_oldest_ready_age_seconds{{{q}}}", "{{queue}}")], unit="s"),
            panel("Paused queues and drain mode", [
                (f"jobfence_queue_paused{{{q}}}", "paused {{queue}}"),
                ("jobfence_draining", "draining")], width=8),
            panel("Database connections in use", [
                ("max(jobfence_database_connections) / "
                 "max(jobfence_database_connections_available)", "in use")],
                unit="percentunit", width=8),
            panel("Age of these metrics", [
                ("time() - max(jobfence_metrics_collected_timestamp_seconds)", "age")],
                unit="s", kind="stat", width=8,
                description="Pushed metrics go stale when the functions stop pushing."),
        ],
        [variable("queue", "label_values(jobfence_jobs, queue)"),
         variable("action", "label_values(jobfence_action_runs_total, action)")])


def functions() -> dict[str, Any]:
    f = 'function=~"$function"'
    return dashboard(
        "jobfence-functions", "jobfence — periodic functions",
        "The periodic functions: runs, last success, health, duration.",
        [
            panel("Runs, by function and status", [
                (f"sum by (function, status) "
                 f"(increase(jobfence_function_runs_total{{{f}}}[{RATE}]))",
                 "{{function}} {{status}}")]),
            panel("Time since the last success", [
                (f"time() - jobfence_function_last_success_timestamp_seconds{{{f}}}",
                 "{{function}}")], unit="s"),
            panel("Health (0 after three failed runs in a row)", [
                (f"jobfence_function_health{{{f}}}", "{{function}}")], kind="stat", width=8),
            panel("Failed runs since the last success", [
                (f"jobfence_function_consecutive_failures{{{f}}}", "{{function}}")],
                kind="stat", width=8),
            panel("Last run's duration", [
                (f"jobfence_function_last_duration_seconds{{{f}}}", "{{function}}")],
                unit="s", width=8),
            panel("Run duration, p50 / p95 / p99",
                  quantiles("jobfence_function_duration_seconds", f, by="function"),
                  unit="s", width=16,
                  description="Every run that ran, from every pod (buckets 0.1 s to 120 s). "
                              "Alert JobfenceFunctionSlow: p95 over 30 s for an hour."),
            panel("Skipped runs (another run held the lease: overlaps)", [
                (f'sum by (function) (increase(jobfence_function_runs_total{{{f}, '
                 f'status="skipped"}}[{RATE}]))', "{{function}}")], width=8,
                description="A run as long as its CronJob's period makes the next one skip."),
        ],
        [variable("function", "label_values(jobfence_function_runs_total, function)")])


def items(function: str, pattern: str) -> str:
    return (f'sum by (item) (increase(jobfence_function_items_total{{function="{function}", '
            f'item=~"{pattern}"}}[{RATE}]))')


def reconciliation() -> dict[str, Any]:
    return dashboard(
        "jobfence-reconciliation", "jobfence — reconciliation, lifecycle and finalization",
        "The database against the cluster and S3: dead claims reclaimed, orphans cleaned, "
        "timeouts, expiry and retention, and how late each came; parents finalized, and "
        "how long after their last child.",
        [
            panel("Reconciliation: dead claims found", [
                (items("reconciliation", "missing_pods_detected|status_drift_detected"),
                 "{{item}}")]),
            panel("Reconciliation: dead claims retried or failed", [
                (items("reconciliation", "retried|failed"), "{{item}}")]),
            panel("Claims reconciliation could not verify (last pass)", [
                ('jobfence_function_snapshot{function="reconciliation", '
                 'item="unverifiable_claims"}', "unverifiable")], kind="stat", width=8),
            panel("Sweeper: expired leases reclaimed", [
                (items("sweeper", "reclaimed|retried|failed"), "{{item}}")], width=16),
            panel("Orphan-cleanup: pods and objects", [
                (items("orphan-cleanup", "orphaned_pods_detected|orphaned_pods_cleaned|"
                       "finished_pods_deleted|orphaned_objects_deleted"), "{{item}}")]),
            panel("Orphan suspects and pods listed (last pass)", [
                ('jobfence_function_snapshot{function="orphan-cleanup", '
                 'item=~"orphan_suspects|pods_listed"}', "{{item}}")]),
            panel("Lifecycle: timeouts and expiry", [
                (items("lifecycle", "timed_out_retried|timed_out_failed|expired_cancelled"),
                 "{{item}}")]),
            panel("Lifecycle: retention (TTL) deletions", [
                (items("lifecycle", "retention_jobs_deleted|retention_children_deleted|"
                       "retention_objects_deleted|events_deleted|function_runs_deleted|"
                       "function_triggers_deleted|control_events_deleted"),
                 "{{item}}")]),
            panel("Lifecycle lag (due → enforced), p50 / p95 / p99",
                  quantiles("jobfence_lifecycle_lag_seconds", "", by="kind"), unit="s",
                  description="How late lifecycle stopped a run past its timeout, cancelled a "
                              "job past its expiry, deleted a job past its retention."),
            panel("Lifecycle: oldest deadline not enforced yet", [
                ("max by (kind) (jobfence_lifecycle_overdue_seconds)", "{{kind}}")],
                unit="s", description="0 when nothing is due. Alert JobfenceLifecycleBehind: "
                                      "over 30 minutes."),
            panel("Parent finalization lag (last child → parent final), p50 / p95 / p99",
                  quantiles("jobfence_parent_finalize_lag_seconds", "", by="queue"),
                  unit="s", width=16,
                  description="From the end of a parent's last child to its own succeeded or "
                              "failed, whoever finalized it."),
            panel("Parents finalized", [
                (items("export-finalize", "parents_succeeded|parents_failed|finalize_errors"),
                 "{{item}}"),
                (items("lifecycle", "parents_finalized"), "lifecycle {{item}}")], width=8),
            panel("Failures", [
                ('sum by (function) (increase(jobfence_function_runs_total{function=~'
                 f'"reconciliation|lifecycle|orphan-cleanup|sweeper", status="failed"}}[{RATE}]))',
                 "{{function}} runs failed"),
                (items("lifecycle", "retention_failures"), "{{item}}"),
                (items("orphan-cleanup", ".*cleanup_failures"), "{{item}}")], width=24),
        ],
        [])


DASHBOARDS = {"overview": overview, "functions": functions, "reconciliation": reconciliation}


def render() -> dict[str, str]:
    """File name → JSON text of every dashboard."""
    return {f"jobfence-{name}.json": json.dumps(make(), indent=2) + "\n"
            for name, make in DASHBOARDS.items()}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(OUT / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
