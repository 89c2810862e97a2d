"""sweeper: expired leases → rotate the fence → back to pending with backoff, or failed
once attempts are exhausted. A job whose worker died is claimable again after one pass; a
datum parent whose last child it failed is finalized in the same pass.
Stopping attempts (cancelled or timed out while their command ran) whose worker never
confirmed the command gone are let go once their lease has run out.

Bounded: batches of ``JOBFENCE_BATCH_SIZE`` rows, each its own transaction, and at most
``MAX_BATCHES`` per step (``jobfence.passes.budget``; the next scheduled run carries on). Whatever
the dead claim held is released with it: the resource lock is the job's own active status,
so it frees itself the moment the job is terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobfence.finalize import finalize_parents_of
from jobfence.passes.budget import Budget
from jobfence.passes.harness import Deps
from jobfence.settings import Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    function: str
    reclaimed: int
    retried: int
    failed: int
    stopping_released: int
    parents_finalized: int
    batches: int


def run_once(settings: Settings, deps: Deps) -> Report:
    store, batch = deps.store, settings.batch_size
    budget = Budget(checkpoint=deps.checkpoint)
    retried = failed = released = finalized = 0
    for done in budget.pages(store.maintenance.reclaim_expired, size=batch, count=len,
                             retry=settings.retry_policy, batch_size=batch):
        retried += sum(1 for t in done if t.status == "pending")
        failed += sum(1 for t in done if t.status == "failed")
        finalized += finalize_parents_of(store, lambda: deps.objects, settings.s3_bucket,
                                         deps.installation, done)
    for let_go in budget.pages(store.maintenance.release_stopped, size=batch, count=len,
                               batch_size=batch):
        released += len(let_go)
    return Report(function="sweeper", reclaimed=retried + failed, retried=retried,
                  failed=failed, stopping_released=released, parents_finalized=finalized,
                  batches=budget.batches)
