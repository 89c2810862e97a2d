"""export-finalize: the safety net behind inline finalization. Parents whose children are
all terminal get their final status and output manifest on S3; waiting jobs whose
dependencies have settled are released (or failed, naming the dependency).

Both halves page through the database in id order, bounded batches; per-item failures (an
S3 error on one parent's manifest, one batch of dependents the database refused) are
logged and counted and the pass goes on — one bad parent never keeps the others, or the
dependents, waiting. The next run retries them. Dependents beyond what a finishing worker
releases inline (``SETTLE_BATCH``) are released here.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from jobfence.errors import JobfenceError, StoreUnavailable
from jobfence.finalize import ZERO, finalize_parent
from jobfence.logs import get_logger
from jobfence.passes.harness import Deps
from jobfence.settings import Settings

log = get_logger("jobfence.export_finalize")


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    function: str
    parents_ready: int
    parents_succeeded: int
    parents_failed: int
    parents_already_final: int
    finalize_errors: int
    dependents_released: int
    dependents_failed: int


def run_once(settings: Settings, deps: Deps) -> Report:
    store, batch = deps.store, settings.batch_size
    ready = ok = failed = raced = errors = 0
    after: UUID = ZERO
    while True:
        deps.checkpoint()
        ids = store.parents.ready(after=after, limit=batch)
        for parent_id in ids:
            ready += 1
            try:
                t = finalize_parent(store, lambda: deps.objects, settings.s3_bucket,
                                    deps.installation, parent_id)
            except StoreUnavailable:
                raise  # the database itself is gone: the pass cannot go on
            except JobfenceError as exc:
                errors += 1
                log.error("finalize_failed", job_id=str(parent_id), error=str(exc))
                continue
            if t is None:
                raced += 1
            elif t.status == "succeeded":
                ok += 1
            else:
                failed += 1
        if len(ids) < batch:
            break
        after = ids[-1]
    released = dep_failed = 0
    after = ZERO
    while True:
        deps.checkpoint()
        ids = store.dependencies.waiting_page(after=after, limit=batch)
        if ids:
            try:
                done, dependents = store.dependencies.release(ids)
                moved = done + dependents
            except StoreUnavailable:
                raise
            except JobfenceError as exc:
                errors += 1
                log.error("dependents_batch_failed", first=str(ids[0]), error=str(exc))
                moved = []
            released += sum(1 for t in moved if t.status in ("pending", "running"))
            dep_failed += sum(1 for t in moved if t.status in ("failed", "cancelled"))
        if len(ids) < batch:
            break
        after = ids[-1]
    return Report(function="export-finalize", parents_ready=ready, parents_succeeded=ok,
                  parents_failed=failed, parents_already_final=raced, finalize_errors=errors,
                  dependents_released=released, dependents_failed=dep_failed)
