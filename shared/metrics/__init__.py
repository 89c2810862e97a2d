"""Prometheus metrics of the periodic functions and the queue, read from the database.

Every value comes from the store (``function_totals``, ``function_status``, partial-index
looks at the queues and lifecycle's deadlines, the ``job_metrics`` and ``action_metrics``
histograms), so a counter never restarts with a pod and the last success survives failed
runs. With ``JOBFENCE_PUSHGATEWAY_URL``, a function pushes its metrics after each pass by
function (never by pod: the gateway never forgets a group), the queue's under
``function="queue"``; ``jobfence metrics`` prints them; prometheus_client is imported only
here, only when needed."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any

from jobfence.logs import get_logger
from jobfence.metrics import gauges
from jobfence.settings import Settings
from jobfence.store import Store

log = get_logger("jobfence.metrics")

JOB = "jobfence"
QUEUE_GROUP = "queue"
UNHEALTHY_AFTER = 3
"""Failed runs in a row after which a function's health is 0."""

DURATION = "duration:"
"""The prefix of a function's totals that hold its duration histogram (``duration:0.5``:
the runs that took at most 0.5 s and more than the bound below; ``duration:sum``)."""

JOB_HISTOGRAMS: tuple[tuple[str, str, str, str | None, str], ...] = (
    # (name in job_metrics, metric, bucket kind, the label's name or None, help)
    ("wait", "jobfence_job_wait_seconds", "wait", None,
     "How long jobs waited for a worker once ready (ready -> claimed), by queue."),
    ("run", "jobfence_job_run_seconds", "run", None,
     "How long jobs ran, claim to terminal status (the attempt that finished them), by "
     "queue."),
    ("lifecycle_lag", "jobfence_lifecycle_lag_seconds", "lag", "kind",
     "How late lifecycle enforced what had come due (due -> done), by queue and kind: a run "
     "timeout, a pending expiry, a retention deletion."),
    ("finalize_lag", "jobfence_parent_finalize_lag_seconds", "lag", None,
     "How long a parent waited between its last child's end and its own final status, by "
     "queue."),
)
"""The job histograms: each a name of ``job_metrics`` (its sum ``<name>_sum``), and one
more here is all a new one takes."""

ACTION_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    # (name in action_metrics, metric, help); the bucket kind: "action" for run, else name
    ("run", "jobfence_action_run_seconds",
     "How long actions ran, started to stored, by queue and action."),
    ("cpu", "jobfence_action_cpu_seconds",
     "CPU seconds an action's result reports using (usage.cpu_seconds), by queue and action."),
    ("memory", "jobfence_action_peak_memory_bytes",
     "Peak memory an action's result reports (usage.peak_memory_bytes), by queue and action."),
)
"""The action histograms, from ``action_metrics``, labelled by queue and action (a name no
worker registered is ``other``)."""


def cumulative(bounds: Iterable[float], per_bucket: Mapping[float, float]) -> list[
        tuple[str, float]]:
    """Counts stored per bucket as Prometheus' cumulative buckets (``le`` as it writes
    them)."""
    from prometheus_client.utils import floatToGoString

    running, buckets = 0.0, []
    for bound in bounds:
        running += per_bucket.get(bound, 0.0)
        buckets.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]
    return buckets


class StoreCollector:
    """A prometheus_client collector over the store: the functions' metrics (one function's,
    or every function's when ``function`` is None; none with ``runs=False``) and each
    queue's gauges (unless ``queue=False``)."""

    def __init__(self, store: Store, *, function: str | None = None, runs: bool = True,
                 queue: bool = True, default_retention: timedelta | None = None) -> None:
        self.store = store
        self.function = function
        self.runs = runs
        self.queue = queue
        self.default_retention = default_retention
        """JOBFENCE_RETENTION_DEFAULT, for the overdue retention of jobs without a ttl."""
        self._bounds: dict[str, list[float]] | None = None

    def bounds(self, kind: str) -> list[float]:
        """The upper bounds of a kind of histogram's buckets, read once per collection."""
        if self._bounds is None:
            self._bounds = self.store.job_metrics.buckets()
        return self._bounds[kind]

    def describe(self) -> Iterable[Any]:
        return []  # nothing to check at registration: the names are fixed below

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        self._bounds = None
        if self.runs:
            only = self.function
            runs = CounterMetricFamily(
                "jobfence_function_runs", "Runs of a periodic function by outcome.",
                labels=["function", "status"])
            items = CounterMetricFamily(
                "jobfence_function_items", "What a periodic function counted, summed over "
                "its runs (e.g. item=orphaned_pods_detected).", labels=["function", "item"])
            took: dict[str, dict[float, float]] = {}
            took_sum: dict[str, float] = {}
            for total in self.store.runs.function_totals(only):
                if total.item.startswith("run:"):
                    runs.add_metric([total.function, total.item[4:]], float(total.total))
                elif total.item == DURATION + "sum":
                    took_sum[total.function] = float(total.total)
                elif total.item.startswith(DURATION):
                    took.setdefault(total.function, {})[float(total.item[len(DURATION):])] = \
                        float(total.total)
                else:
                    items.add_metric([total.function, total.item], float(total.total))
            durations = HistogramMetricFamily(
                "jobfence_function_duration_seconds", "How long the function's runs took "
                "(each that ran: succeeded, failed or interrupted).", labels=["function"])
            for function, per_bucket in sorted(took.items()):
                durations.add_metric([function], cumulative(self.bounds("pass"), per_bucket),
                                     took_sum.get(function, 0.0))
            success = GaugeMetricFamily(
                "jobfence_function_last_success_timestamp_seconds",
                "When the function last finished a run successfully (Unix time).",
                labels=["function"])
            duration = GaugeMetricFamily(
                "jobfence_function_last_duration_seconds",
                "How long the function's last run took.", labels=["function"])
            health = GaugeMetricFamily(
                "jobfence_function_health", f"1 while the function is healthy, 0 once "
                f"{UNHEALTHY_AFTER} runs in a row have failed (back to 1 on a success).",
                labels=["function"])
            failures = GaugeMetricFamily(
                "jobfence_function_consecutive_failures",
                "Failed runs of the function since its last success.", labels=["function"])
            seen = GaugeMetricFamily(
                "jobfence_function_snapshot", "What the function's last successful run saw "
                "at that moment (e.g. item=orphan_suspects): a current value, never a sum.",
                labels=["function", "item"])
            for status in self.store.runs.function_status(only):
                if status.last_success_at is not None:
                    success.add_metric([status.function], status.last_success_at.timestamp())
                if status.last_duration_seconds is not None:
                    duration.add_metric([status.function], status.last_duration_seconds)
                health.add_metric([status.function], 0.0 if status.consecutive_failures
                                  >= UNHEALTHY_AFTER else 1.0)
                failures.add_metric([status.function], float(status.consecutive_failures))
                for item, value in sorted((status.last_values or {}).items()):
                    seen.add_metric([status.function, item], float(value))
            yield from (runs, items, durations, success, duration, health, failures, seen)
        if self.queue:
            yield from self._queues()

    def _queues(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        yield from gauges.queue_gauges(self.store)
        yield from gauges.workflow_gauges(self.store)
        overdue = GaugeMetricFamily(
            "jobfence_lifecycle_overdue_seconds", "How long ago the oldest deadline that "
            "lifecycle has not enforced yet came due, by kind (timeout, expiry, retention); "
            "0 when none has.", labels=["kind"])
        for kind, seconds in self.store.job_metrics.overdue(
                default_retention=self.default_retention).items():
            overdue.add_metric([kind], seconds)
        yield overdue
        yield from self._job_totals()
        yield from self._action_totals()
        yield GaugeMetricFamily(
            "jobfence_metrics_collected_timestamp_seconds", "When the queue and job metrics "
            "beside it were read from the database (Unix time): pushed values go stale when "
            "the functions that push them stop.", value=time.time())
        draining = self.store.control.drain_status().draining
        yield GaugeMetricFamily("jobfence_draining", "1 while drain mode is on.",
                                value=1.0 if draining else 0.0)
        conns = self.store.control.connections()
        yield GaugeMetricFamily(
            "jobfence_database_connections", "Client connections the PostgreSQL server has "
            "open (every database and user: what counts against max_connections).",
            value=float(conns.in_use))
        yield GaugeMetricFamily(
            "jobfence_database_connections_available", "Connections the server allows a "
            "non-superuser (max_connections less superuser_reserved_connections).",
            value=float(conns.available))


    def _job_totals(self) -> Iterator[Any]:
        """Jobs finished, attempts ended, and the job histograms by queue: the totals the
        periodic passes fold (as of the last pass)."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        finished = CounterMetricFamily(
            "jobfence_jobs_finished", "Jobs that reached a terminal status, by queue.",
            labels=["queue", "status"])
        attempts = CounterMetricFamily(
            "jobfence_job_attempts", "Attempts that ended, by queue and outcome: succeeded, "
            "failed, cancelled, retried, interrupted (SIGTERM) or lost (fence taken).",
            labels=["queue", "outcome"])
        stops = CounterMetricFamily(
            "jobfence_job_stops", "Actions a worker stopped, by queue and why: inactive (no "
            "output or progress for its inactivity timeout) or timed_out (past the job's "
            "timeout).", labels=["queue", "why"])
        faults = CounterMetricFamily(
            "jobfence_worker_guard_faults", "Ticks of a worker's guard that raised (a "
            "connection lost, a job's hostile bytes, an OSError, a bug), noted and survived, "
            "by queue and guard (heartbeat, stop_check, watchdog, tree_kill, output, "
            "sidecar).", labels=["queue", "guard"])
        names = {h[0] for h in JOB_HISTOGRAMS}
        counts: dict[tuple[str, str, str], dict[float, float]] = {}
        sums: dict[tuple[str, str, str], float] = {}
        for t in self.store.job_metrics.totals():
            if t.name == "finished":
                finished.add_metric([t.queue, t.label], t.value)
            elif t.name == "attempts":
                attempts.add_metric([t.queue, t.label], t.value)
            elif t.name == "stops":
                stops.add_metric([t.queue, t.label], t.value)
            elif t.name == "guard_faults":
                faults.add_metric([t.queue, t.label], t.value)
            elif t.name in names:
                counts.setdefault((t.name, t.queue, t.label), {})[t.le] = t.value
            elif t.name.endswith("_sum") and t.name[:-4] in names:
                sums[(t.name[:-4], t.queue, t.label)] = t.value
        yield from (finished, attempts, stops, faults)
        for name, metric, kind, label, help_text in JOB_HISTOGRAMS:
            family = HistogramMetricFamily(metric, help_text,
                                           labels=["queue", *([label] if label else [])])
            for key, per_bucket in sorted(counts.items()):
                if key[0] == name:
                    family.add_metric([key[1], *([key[2]] if label else [])],
                                      cumulative(self.bounds(kind), per_bucket),
                                      sums.get(key, 0.0))
            yield family


    def _action_totals(self) -> Iterator[Any]:
        """Action runs by outcome, and the action histograms, by queue and action."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        runs = CounterMetricFamily(
            "jobfence_action_runs", "Actions whose outcome was stored, by queue, action and "
            "outcome (succeeded, failed).", labels=["queue", "action", "outcome"])
        counts: dict[tuple[str, str, str], dict[float, float]] = {}
        sums: dict[tuple[str, str, str], float] = {}
        for t in self.store.action_metrics.totals():
            if t.name == "runs":
                runs.add_metric([t.queue, t.action, t.label], t.value)
            elif t.name.endswith("_sum"):
                sums[(t.name[:-4], t.queue, t.action)] = t.value
            else:
                counts.setdefault((t.name, t.queue, t.action), {})[t.le] = t.value
        yield runs
        bounds = self.store.action_metrics.buckets() if counts else {}
        for name, metric, help_text in ACTION_HISTOGRAMS:
            family = HistogramMetricFamily(metric, help_text, labels=["queue", "action"])
            for key, per_bucket in sorted(counts.items()):
                if key[0] == name:
                    family.add_metric([key[1], key[2]], cumulative(
                        bounds["action" if name == "run" else name], per_bucket),
                        sums.get(key, 0.0))
            yield family


class ScrapeCollector:
    """Every metric, read from the database on each scrape (``jobfence metrics --serve``):
    a connection per scrape, so a restarted database or a pooler in between costs one
    scrape. ``jobfence_database_up`` says whether the read worked; nothing here goes stale."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from jobfence.db import connect
        from jobfence.errors import JobfenceError

        up = GaugeMetricFamily("jobfence_database_up", "1 when this scrape read the "
                               "database, 0 when it could not.")
        try:
            conn = connect(self.settings.database_url, pooler=self.settings.database_pooler,
                           application_name="jobfence-metrics",
                           connect_timeout=self.settings.connect_timeout_seconds)
            try:
                families = list(StoreCollector(
                    Store(conn, self.settings.schema_name),
                    default_retention=self.settings.retention_default).collect())
            finally:
                conn.close()
        except JobfenceError as exc:
            log.warning("scrape_failed", error=str(exc))
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families


def serve(settings: Settings, host: str, port: int, ready: Any = None) -> None:
    """Serve every metric at ``http://host:port/metrics`` until SIGTERM (``ready`` is
    called with the bound port once it listens)."""
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import CollectorRegistry, make_wsgi_app

    from jobfence.shutdown import on_termination

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # a scrape every few seconds is not news

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector(settings))
    server = make_server(host, port, make_wsgi_app(registry), WSGIServer, Quiet)
    log.info("metrics_listening", host=host, port=server.server_port)
    if ready is not None:
        ready(server.server_port)
    with on_termination(lambda _signum: threading.Thread(target=server.shutdown).start()):
        server.serve_forever(poll_interval=0.2)
    server.server_close()


def _registry(collector: StoreCollector) -> Any:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(store: Store, default_retention: timedelta | None = None) -> str:
    """Every function's metrics and the queue's, in the Prometheus text format."""
    from prometheus_client import generate_latest

    text: str = generate_latest(_registry(StoreCollector(
        store, default_retention=default_retention))).decode()
    return text


def push(settings: Settings, store: Store, function: str) -> bool:
    """Push the function's metrics and the queue's to the Pushgateway, if one is set.
    A failed push is logged, never fatal: the run itself is recorded in the database."""
    if not settings.pushgateway_url:
        return False
    from prometheus_client import pushadd_to_gateway

    try:
        pushadd_to_gateway(settings.pushgateway_url, job=JOB,
                           grouping_key={"function": function}, timeout=5,
                           registry=_registry(StoreCollector(store, function=function,
                                                             queue=False)))
        if settings.push_queue_metrics:
            pushadd_to_gateway(settings.pushgateway_url, job=JOB,
                               grouping_key={"function": QUEUE_GROUP}, timeout=5,
                               registry=_registry(StoreCollector(
                                   store, runs=False,
                                   default_retention=settings.retention_default)))
    except Exception as exc:  # an unreachable gateway must not fail the pass
        log.warning("metrics_push_failed", gateway=settings.pushgateway_url, error=str(exc))
        return False
    return True
