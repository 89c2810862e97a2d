"""sweeper: expired leases → rotate the fence → back to pending with backoff, or failed
once attempts are exhausted. A job whose worker died is claimable again after one pass; a
datum parent whose last child it failed is finalized in the same pass.
Stopping attempts (cancelled or timed out while their command ran) whose worker never
confirmed the command gone are let go once their lease has run out.

Bounded: batches of ``JOBFENCE_BATCH_SIZE`` rows, each its own transaction, and at most
``MAX_BATCHES`` per pass (the next scheduled run carries on). Whatever the dead claim held
is released with it: the resource lock is the job's own active status, so it frees itself
the moment the job is terminal.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from jobfence.finalize import finalize_parents_of
from jobfence.runner import Deps, run_pass
from jobfence.settings import Settings
from jobfence.store import RetryPolicy

MAX_BATCHES = 200


@dataclass(frozen=True, slots=True)
class Report:
    function: str
    reclaimed: int
    retried: int
    failed: int
    stopping_released: int
    parents_finalized: int
    batches: int


def run_once(settings: Settings, deps: Deps) -> Report:
    retry = RetryPolicy(settings.retry_base_seconds, settings.retry_max_seconds)
    retried = failed = released = finalized = batches = 0
    while batches < MAX_BATCHES:
        deps.checkpoint()
        done = deps.store.maintenance.reclaim_expired(retry=retry, batch_size=settings.batch_size)
        batches += 1
        retried += sum(1 for t in done if t.status == "pending")
        failed += sum(1 for t in done if t.status == "failed")
        finalized += finalize_parents_of(deps.store, lambda: deps.objects, settings.s3_bucket,
                                         deps.installation, done)
        if len(done) < settings.batch_size:
            break
    while batches < MAX_BATCHES:
        deps.checkpoint()
        let_go = deps.store.maintenance.release_stopped(batch_size=settings.batch_size)
        batches += 1
        released += len(let_go)
        if len(let_go) < settings.batch_size:
            break
    return Report("sweeper", retried + failed, retried, failed, released, finalized, batches)


def main(argv: list[str] | None = None) -> int:
    return run_pass("sweeper", sys.argv[1:] if argv is None else argv, run_once, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
