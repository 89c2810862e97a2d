"""The cluster port: only what reconciliation, orphan-cleanup and the console call, with three
implementations — the Kubernetes API (``jobfence.adapters.kube``), worker processes on this
machine (``jobfence.adapters.local_cluster``, for the demo) and an in-memory fake
(``devtools.memory_cluster``, for unit tests).

The database is the source of truth; the cluster is compared against it. Listing is page
by page, so a pass never holds every pod at once; a listing that fails part-way raises
``ClusterError`` and the caller changes nothing (if uncertain, log and skip).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from jobfence.errors import ClusterError

__all__ = ["Cluster", "ClusterError", "Identity", "Pod"]


@dataclass(frozen=True, slots=True)
class Pod:
    """A worker pod as the functions need it."""

    name: str
    phase: str
    """Pending, Running, Succeeded, Failed or Unknown."""
    created_at: datetime | None = None
    started_at: datetime | None = None
    """When its process started (a claim older than this was made by someone else)."""
    job_name: str | None = None
    """The Job that owns the pod; deleting it keeps Kubernetes from starting another."""
    deleting: bool = False
    """Deletion already requested (terminating): leave it to its grace period."""
    uid: str | None = None
    """The pod object's uid: a delete names it as a precondition, so that it never reaches
    another pod that took the name since the listing."""
    job_uid: str | None = None
    """The owner Job's uid, for the same reason."""
    reason: str | None = None
    """Why it ended, when it did not end well: the pod's own reason (Evicted...) and each
    container that ended abnormally ("jobfence: OOMKilled, exit 137")."""

    def row(self) -> dict[str, object]:
        return {"name": self.name, "phase": self.phase,
                "created_at": self.created_at.isoformat() if self.created_at else None,
                "started_at": self.started_at.isoformat() if self.started_at else None,
                "job_name": self.job_name, "deleting": self.deleting, "uid": self.uid,
                "job_uid": self.job_uid, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a bearer token belongs to, as the cluster's TokenReview says."""

    user: str
    groups: tuple[str, ...] = ()


class Cluster(Protocol):
    claimer_pattern: str
    """A POSIX regular expression matching the worker ids this cluster can vouch for:
    a claim by anyone else (a worker run by hand on a laptop) is never judged."""

    def worker_pod_pages(self) -> Iterator[list[Pod]]:
        """Every worker pod, a page at a time; raises ClusterError if the listing cannot
        be completed (the caller must then treat what it saw as incomplete)."""
        ...

    def delete_pod(self, name: str, *, uid: str | None, grace_seconds: int) -> bool:
        """Delete a pod — only the one with ``uid`` when given; False if it was already gone
        (or the name now belongs to another pod)."""
        ...

    def delete_job(self, name: str, *, uid: str | None, grace_seconds: int) -> bool:
        """Delete a Job and its pods — only the one with ``uid`` when given; False if it was
        already gone (or the name now belongs to another Job)."""
        ...

    def trigger(self, function: str, *, requested_by: str, reason: str) -> str:
        """Run a periodic function now, as its schedule would (a Job from its CronJob's
        template), telling the run who asked and why (``JOBFENCE_TRIGGERED_BY``,
        ``JOBFENCE_TRIGGER_REASON``); the name of what was started. ``ClusterError`` when
        it could not be started."""
        ...

    def review_token(self, token: str) -> Identity | None:
        """Whom a bearer token belongs to (a TokenReview), or None when it is not valid.
        ``ClusterError`` when the cluster cannot say."""
        ...


# Kubernetes object names are DNS subdomains: a claimer id with ':' or '/' is not a pod.
POD_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


def local_claimer_pattern(installation: str, host: str) -> str:
    return "^local:" + re.escape(installation) + ":" + re.escape(host) + ":[0-9]+$"


INSTALLATION_LABEL = "jobfence.io/installation"
"""The label every worker pod of an installation carries; the Kubernetes adapter adds
``INSTALLATION_LABEL=<installation>`` to every selector it lists pods with."""


PERIODIC_FUNCTIONS = ("sweeper", "reconciliation", "lifecycle", "export-finalize",
                      "orphan-cleanup", "schedules")
"""The functions a CronJob schedules (manifests/cronjobs): those a manual trigger may start."""


def cronjob_name(function: str) -> str:
    """The CronJob that schedules a periodic function (manifests/cronjobs)."""
    return f"jobfence-{function}"
