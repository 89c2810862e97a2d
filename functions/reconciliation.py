"""reconciliation: the database against the cluster. Live claims whose worker pod is gone
(deleted, evicted, its node lost) or has finished, failed or gone Unknown are dead: their
fence is rotated and the job retried — or failed with "worker pod ... disappeared" once its
attempts are exhausted — long before its lease would run out.

Fail-safe: the pods are listed page by page into a snapshot first; if the listing fails or
cannot be completed, nothing is changed and the pass fails. Claims younger than the grace
period, and claims by workers the cluster cannot vouch for (run by hand outside it), are
never judged. Pods without a claim are orphan-cleanup's business.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from datetime import datetime

from jobfence.cluster import Cluster
from jobfence.errors import JobfenceError
from jobfence.logs import get_logger
from jobfence.runner import Deps, run_pass
from jobfence.settings import Settings
from jobfence.store import RetryPolicy

log = get_logger("jobfence.reconciliation")

MAX_BATCHES = 200


@dataclass(frozen=True, slots=True)
class Report:
    function: str
    cluster: str
    pods_listed: int = 0
    pages: int = 0
    missing_pods_detected: int = 0
    """Live claims whose pod is gone."""
    status_drift_detected: int = 0
    """Live claims whose pod has finished, failed or gone Unknown."""
    retried: int = 0
    failed: int = 0
    unverifiable_claims: int = 0


def snapshot(deps: Deps, cluster: Cluster) -> tuple[datetime, int, int]:
    """List the worker pods into the store's snapshot: (listed_at, pods, pages). Raises
    ClusterError, leaving nothing changed, if the listing cannot be completed."""
    listed_at = deps.store.pods.snapshot_begin(deps.pass_id, deps.now)
    pods = pages = 0
    for page in cluster.worker_pod_pages():
        deps.checkpoint()
        deps.store.pods.snapshot_add([p.row() for p in page])
        pods += len(page)
        pages += 1
    return listed_at, pods, pages


def run_once(settings: Settings, deps: Deps) -> Report:
    cluster = deps.cluster
    if cluster is None:
        log.warning("reconciliation_skipped", reason="JOBFENCE_CLUSTER is none: no pods to "
                    "compare the claims with")
        return Report("reconciliation", settings.cluster)
    try:
        return _reconcile(settings, deps, cluster)
    finally:
        with contextlib.suppress(JobfenceError):  # else a later pass deletes it
            deps.store.pods.snapshot_end()


def _reconcile(settings: Settings, deps: Deps, cluster: Cluster) -> Report:
    listed_at, pods, pages = snapshot(deps, cluster)
    retry = RetryPolicy(settings.retry_base_seconds, settings.retry_max_seconds)
    missing = drift = retried = failed = 0
    for _ in range(MAX_BATCHES):
        deps.checkpoint()
        done = deps.store.pods.reclaim_dead_claims(
            claimer_pattern=cluster.claimer_pattern, listed_at=listed_at,
            grace_seconds=settings.reconcile_grace_seconds, retry=retry,
            batch_size=settings.batch_size)
        for t, was_missing in done:
            missing += was_missing
            drift += not was_missing
            retried += t.status == "pending"
            failed += t.status == "failed"
            log.warning("missing_pod_detected" if was_missing else "status_drift_detected",
                        job_id=str(t.job_id), job_status=t.status)
        if len(done) < settings.batch_size:
            break
    unverifiable = deps.store.pods.unverifiable_claims(claimer_pattern=cluster.claimer_pattern)
    if unverifiable:
        log.info("unverifiable_claims", count=unverifiable,
                 message="claims by workers outside the cluster are left to the sweeper")
    return Report("reconciliation", settings.cluster, pods, pages, missing, drift, retried,
                  failed, unverifiable)


def main(argv: list[str] | None = None) -> int:
    return run_pass("reconciliation", sys.argv[1:] if argv is None else argv, run_once,
                    __doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
