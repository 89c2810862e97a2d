"""The gauges of queues and workflows, read from the store at each collection
(``jobfence.metrics.StoreCollector``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jobfence.store import Store

QUEUE_GAUGES: tuple[tuple[str, str], ...] = (
    ("jobfence_jobs_scheduled", "Pending jobs whose run_at has not come yet."),
    ("jobfence_queue_oldest_ready_age_seconds", "How long the queue's oldest claimable job "
     "has been waiting for a worker."),
    ("jobfence_queue_paused", "1 while the queue is paused."),
    ("jobfence_queue_limit", "The queue's limit on running jobs (absent when it has none)."),
    ("jobfence_queue_rate_limit", "How many of the queue's jobs may start in any window of its "
     "rate's period (absent when it has no rate)."),
    ("jobfence_queue_rate_period_seconds", "The period of the queue's rate."),
    ("jobfence_queue_rate_started", "How many of the queue's jobs started within the last "
     "period of its rate."),
    ("jobfence_queue_group_limit", "The queue's limit on each group's running jobs (absent "
     "when it has none)."),
    ("jobfence_queue_fair", "1 while the queue claims round-robin across its groups (absent "
     "when it has no group settings)."),
)
"""A queue's gauges by queue (its settings present only when it has them)."""
GROUP_JOBS_HELP = ("Active jobs of each group (tenant) of a queue with a limit on each group "
                   "or round-robin, by status: its 100 busiest groups (\"\": no group).")



def queue_gauges(store: Store) -> Iterator[Any]:
    """Each queue's jobs by status, its settings, and its groups' jobs."""
    from prometheus_client.core import GaugeMetricFamily

    jobs = GaugeMetricFamily("jobfence_jobs", "Active jobs by queue and status (pending "
                             "includes scheduled jobs).", labels=["queue", "status"])
    gauges = {name: GaugeMetricFamily(name, text, labels=["queue"])
              for name, text in QUEUE_GAUGES}
    groups = GaugeMetricFamily("jobfence_group_jobs", GROUP_JOBS_HELP,
                               labels=["queue", "group", "status"])
    for q in store.queues.status():
        for state, n in (("waiting", q.waiting), ("pending", q.pending + q.scheduled),
                         ("running", q.running)):
            jobs.add_metric([q.queue, state], float(n))
        for (name, _), value in zip(QUEUE_GAUGES, (
                q.scheduled, q.oldest_ready_age_seconds, q.paused, q.limit, q.rate_limit,
                q.rate_period_seconds, q.rate_started, q.group_limit,
                q.fair if q.fair or q.group_limit is not None else None), strict=True):
            if value is not None:
                gauges[name].add_metric([q.queue], float(value))
        for g in (store.queues.groups(q.queue, limit=100)
                  if q.fair or q.group_limit is not None else ()):
            for state, n in (("waiting", g.waiting), ("pending", g.pending + g.scheduled),
                             ("running", g.running)):
                groups.add_metric([q.queue, g.group or "", state], float(n))
    yield from (jobs, *gauges.values(), groups)


def workflow_gauges(store: Store) -> Iterator[Any]:
    """The workflows of the last day by status; each workflow name's latest finished one:
    how long it took and how many of its steps failed."""
    from prometheus_client.core import GaugeMetricFamily

    count = GaugeMetricFamily("jobfence_workflows", "Workflows submitted in the last 24 hours, "
                              "by status (running, succeeded, failed, cancelled).",
                              labels=["status"])
    took = GaugeMetricFamily("jobfence_workflow_last_duration_seconds", "How long each "
                             "workflow name's latest finished workflow took, submitted to "
                             "its last step's end.", labels=["workflow", "status"])
    failed = GaugeMetricFamily("jobfence_workflow_last_steps_failed", "How many steps of "
                               "each workflow name's latest finished workflow failed or were "
                               "cancelled.", labels=["workflow", "status"])
    summary = store.workflows.summary()
    for status, n in sorted(summary.counts.items()):
        count.add_metric([status], float(n))
    for last in summary.latest:
        took.add_metric([last.name, last.status], last.seconds or 0.0)
        failed.add_metric([last.name, last.status], float(last.steps_failed))
    yield from (count, took, failed)
