"""The fenced store: every verb on jobs is one statement or one transaction, and every write
after a claim is predicated on the claim's ``attempt_id`` and reports whether it matched.

Verbs are grouped by what they act on, each group with its SQL in the file of the same name
beside it (``attempts.py`` runs ``attempts.sql``):

==============  ==========================================================================
noun            verbs
==============  ==========================================================================
jobs            enqueue, get, list, cancel, events, action results, children counts
attempts        claim, heartbeat, record an action, finish, release, interrupt, outputs
dependencies    record `after`, settle what waited on jobs that finished
parents         datum parents: ready, children pages, the one finalization
maintenance     reclaim expired leases, run timeouts, pending expiry, retention
runs            runs of the periodic functions and their totals
job_metrics     jobs finished, attempts ended, wait and run times: folded totals by queue
action_metrics  action runs, run times, resource usage: folded totals by queue and action
pods            a pass's snapshot of the worker pods: dead claims, orphan suspects, objects
control         drain mode
queues          each pool's KEDA trigger count, each queue's state and settings
triggers        manual triggers of the periodic functions: one per interval, who and why
schedules       users' schedules: add, pause, resume, delete; the due ticks, fired once each
traces          the trace context of the attempt holding the fence (a worker that traces)
workflows       a graph of named steps submitted at once: its row, its state, its marks
==============  ==========================================================================

Callers never write SQL; they call these verbs with keyword arguments for ids and fences.
"""

from __future__ import annotations

from functools import cached_property

from jobfence.db import Connection
from jobfence.store.action_metrics import ActionMetrics
from jobfence.store.attempts import Attempts
from jobfence.store.batches import ClaimRequest, TerminalWrite
from jobfence.store.control import Control
from jobfence.store.dependencies import SETTLE_BATCH, Dependencies
from jobfence.store.job_metrics import JobMetrics
from jobfence.store.jobs import Jobs
from jobfence.store.maintenance import Maintenance, RetentionCandidate
from jobfence.store.parents import Parents
from jobfence.store.pods import Pods
from jobfence.store.queues import Queues
from jobfence.store.runs import Runs
from jobfence.store.schedules import Schedules
from jobfence.store.traces import Traces
from jobfence.store.triggers import Triggers
from jobfence.store.types import (
    ACTIVE,
    IMMEDIATE,
    TERMINAL,
    ActionOutcome,
    ChildBatches,
    Claim,
    Enqueued,
    JobRow,
    NewJob,
    RetryPolicy,
    Transition,
)
from jobfence.store.workflows import Workflows

__all__ = [
    "ACTIVE", "IMMEDIATE", "SETTLE_BATCH", "TERMINAL", "ActionOutcome", "ChildBatches",
    "Claim", "ClaimRequest", "Enqueued", "JobRow", "NewJob", "RetentionCandidate",
    "RetryPolicy", "Store", "TerminalWrite", "Transition",
]

DEFAULT_SCHEMA = "jobfence"


class Store:
    """The store's verbs over one connection, for one installation's schema. Each noun is
    built (and its SQL rendered for the schema) on first use: a short-lived function pays
    only for the nouns it touches."""

    def __init__(self, conn: Connection, schema: str = DEFAULT_SCHEMA) -> None:
        self.conn = conn
        self.schema = schema

    @cached_property
    def jobs(self) -> Jobs:
        return Jobs(self.conn, self.schema, self.dependencies, self.control)

    @cached_property
    def attempts(self) -> Attempts:
        return Attempts(self.conn, self.schema, self.dependencies)

    @cached_property
    def dependencies(self) -> Dependencies:
        return Dependencies(self.conn, self.schema)

    @cached_property
    def parents(self) -> Parents:
        return Parents(self.conn, self.schema, self.dependencies)

    @cached_property
    def maintenance(self) -> Maintenance:
        return Maintenance(self.conn, self.schema, self.dependencies)

    @cached_property
    def runs(self) -> Runs:
        return Runs(self.conn, self.schema)

    @cached_property
    def pods(self) -> Pods:
        return Pods(self.conn, self.schema, self.dependencies)

    @cached_property
    def control(self) -> Control:
        return Control(self.conn, self.schema)

    @cached_property
    def queues(self) -> Queues:
        return Queues(self.conn, self.schema)

    @cached_property
    def job_metrics(self) -> JobMetrics:
        return JobMetrics(self.conn, self.schema)

    @cached_property
    def action_metrics(self) -> ActionMetrics:
        return ActionMetrics(self.conn, self.schema)

    @cached_property
    def triggers(self) -> Triggers:
        return Triggers(self.conn, self.schema)

    @cached_property
    def schedules(self) -> Schedules:
        return Schedules(self.conn, self.schema)

    @cached_property
    def traces(self) -> Traces:
        return Traces(self.conn, self.schema)

    @cached_property
    def workflows(self) -> Workflows:
        return Workflows(self.conn, self.schema)
