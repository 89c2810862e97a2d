"""The fenced store: every verb on jobs is one statement or one transaction, and every write
after a claim is predicated on the claim's ``attempt_id`` and reports whether it matched.

Verbs are grouped by what they act on, each group with its SQL in the file of the same name
beside it (``attempts.py`` runs ``attempts.sql``):

============  ==========================================================================
noun          verbs
============  ==========================================================================
jobs          enqueue, get, list, cancel, events, action results, children counts
attempts      claim, heartbeat, record an action, finish, release, interrupt, outputs
dependencies  record `after`, settle what waited on jobs that finished
parents       datum parents: ready, children pages, the one finalization
maintenance   reclaim expired leases, run timeouts, pending expiry, retention
runs          runs of the periodic functions and their totals
pods          a pass's snapshot of the worker pods: dead claims, orphan suspects, objects
control       drain mode
queues        the KEDA trigger's count, the queue gauges
============  ==========================================================================

Callers never write SQL; they call these verbs with keyword arguments for ids and fences.
"""

from __future__ import annotations

from jobfence.db import Connection
from jobfence.store.attempts import Attempts
from jobfence.store.control import Control
from jobfence.store.dependencies import SETTLE_BATCH, Dependencies
from jobfence.store.jobs import Jobs
from jobfence.store.maintenance import Maintenance
from jobfence.store.parents import Parents
from jobfence.store.pods import Pods
from jobfence.store.queues import Queues
from jobfence.store.runs import Runs
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
    RetentionCandidate,
    RetryPolicy,
    Transition,
)

__all__ = [
    "ACTIVE", "IMMEDIATE", "SETTLE_BATCH", "TERMINAL", "ActionOutcome", "ChildBatches",
    "Claim", "Enqueued", "JobRow", "NewJob", "RetentionCandidate", "RetryPolicy", "Store",
    "Transition",
]

DEFAULT_SCHEMA = "jobfence"


class Store:
    """The store's verbs over one connection, for one installation's schema."""

    def __init__(self, conn: Connection, schema: str = DEFAULT_SCHEMA) -> None:
        self.conn = conn
        self.schema = schema
        self.jobs = Jobs(self)
        self.attempts = Attempts(self)
        self.dependencies = Dependencies(self)
        self.parents = Parents(self)
        self.maintenance = Maintenance(self)
        self.runs = Runs(self)
        self.pods = Pods(self)
        self.control = Control(self)
        self.queues = Queues(self)
