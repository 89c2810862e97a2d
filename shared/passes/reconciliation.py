"""reconciliation: the database against the cluster. Live claims whose worker pod is gone
(deleted, evicted, its node lost) or has finished, failed or gone Unknown are dead: their
fence is rotated and the job retried — or failed with "worker pod ... disappeared" once its
attempts are exhausted — long before its lease would run out. A datum parent whose last
child it failed is finalized in the same pass.

Fail-safe: the pods are listed page by page into a snapshot first; if the listing fails or
cannot be completed, nothing is changed and the pass fails. Claims younger than the grace
period, and claims by workers the cluster cannot vouch for (run by hand outside it), are
never judged. Pods without a claim are orphan-cleanup's business.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobfence.finalize import finalize_parents_of
from jobfence.logs import get_logger
from jobfence.passes.budget import Budget
from jobfence.passes.harness import Deps, snapshot
from jobfence.settings import Settings

log = get_logger("jobfence.reconciliation")


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    function: str
    cluster: str
    pods_listed: int = snapshot()
    pages: int = 0
    missing_pods_detected: int = 0
    """Live claims whose pod is gone."""
    status_drift_detected: int = 0
    """Live claims whose pod has finished, failed or gone Unknown."""
    retried: int = 0
    failed: int = 0
    unverifiable_claims: int = snapshot()
    parents_finalized: int = 0
    """Datum parents whose last child this pass failed, finalized in it."""


def run_once(settings: Settings, deps: Deps) -> Report:
    cluster = deps.cluster
    if cluster is None:
        log.warning("reconciliation_skipped", reason="JOBFENCE_CLUSTER is none: no pods to "
                    "compare the claims with")
        return Report(function="reconciliation", cluster=settings.cluster)
    budget = Budget(checkpoint=deps.checkpoint)
    missing = drift = retried = failed = finalized = 0
    with deps.pod_snapshot(cluster) as listed:
        for done in budget.pages(
                deps.store.pods.reclaim_dead_claims, size=settings.batch_size, count=len,
                claimer_pattern=cluster.claimer_pattern, listed_at=listed.listed_at,
                grace_seconds=settings.reconcile_grace_seconds, retry=settings.retry_policy,
                batch_size=settings.batch_size):
            for t, was_missing in done:
                missing += was_missing
                drift += not was_missing
                retried += t.status == "pending"
                failed += t.status == "failed"
                log.warning("missing_pod_detected" if was_missing else "status_drift_detected",
                            job_id=str(t.job_id), job_status=t.status)
            finalized += finalize_parents_of(deps.store, lambda: deps.objects,
                                             settings.s3_bucket, deps.installation,
                                             [t for t, _ in done])
    unverifiable = deps.store.pods.unverifiable_claims(claimer_pattern=cluster.claimer_pattern)
    if unverifiable:
        log.info("unverifiable_claims", count=unverifiable,
                 message="claims by workers outside the cluster are left to the sweeper")
    return Report(function="reconciliation", cluster=settings.cluster, pods_listed=listed.pods,
                  pages=listed.pages, missing_pods_detected=missing,
                  status_drift_detected=drift, retried=retried, failed=failed,
                  unverifiable_claims=unverifiable, parents_finalized=finalized)
