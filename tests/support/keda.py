"""A pool's KEDA trigger as the manifest tests read it: the ScaledJob's postgresql query and
the limits KEDA's default scaling strategy applies with it, the value the scaler reads from
a real database, and worker pods' claims to put in that database."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from jobfence.db import Connection
from jobfence.store import Store
from tests.support.manifests import Obj, one


@dataclass(frozen=True)
class Trigger:
    """The ScaledJob's postgresql trigger and the limits KEDA applies with it."""

    query: str
    target: float
    activation: float
    max_replicas: int
    queue: str

    def new_jobs(self, value: float, running_jobs: int) -> int:
        """Worker Jobs KEDA creates on one poll with the default scaling strategy
        (kedacore/keda pkg/scaling/executor/scale_jobs.go): none while the trigger is not
        active (value <= activation); otherwise min(maxReplicaCount, ceil(value / target))
        minus the Jobs it started that have not finished, never below zero."""
        if value <= self.activation:
            return 0
        max_scale = min(self.max_replicas, math.ceil(value / self.target))
        return max(0, max_scale - running_jobs)


def trigger_of(base: list[Obj], pool: str) -> Trigger:
    """The trigger of pool ``pool``'s ScaledJob in the rendered objects."""
    spec = one(base, "ScaledJob", f"jobfence-worker-{pool}")["spec"]
    [pg] = spec["triggers"]
    assert pg["type"] == "postgresql"
    meta = pg["metadata"]
    labels = spec["jobTargetRef"]["template"]["metadata"]["labels"]
    return Trigger(query=meta["query"], target=float(meta["targetQueryValue"]),
                   activation=float(meta["activationTargetQueryValue"]),
                   max_replicas=int(spec.get("maxReplicaCount", 100)),
                   queue=labels["jobfence.io/queue"])


def value(conn: Connection, trigger: Trigger) -> float:
    """What KEDA's postgresql scaler reads: the first column of the one row."""
    rows = conn.execute(trigger.query).fetchall()
    assert len(rows) == 1
    return float(next(iter(rows[0].values())))


def claim(store: Store, n: int, queue: str) -> list[Any]:
    """``n`` jobs of ``queue`` claimed, as worker pods hold them."""
    claims = store.attempts.claim(worker_id="worker-pod", lease_seconds=300, limit=n,
                                  queue=queue)
    assert len(claims) == n
    return claims
