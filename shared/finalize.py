"""Finalizing a datum parent once every child is terminal: one terminal write and one
manifest, whoever gets there first.

The parent becomes ``succeeded`` when all children succeeded, else ``failed`` with counts and
the first errors; a JSON manifest listing each child with its status and committed output
URLs is written to ``s3://BUCKET/jobfence/INSTALLATION/PARENT/manifest.json`` and linked from
the job.

Any number of finalizers may race — the worker whose attempt ended the last child (seconds
after it), lifecycle and the sweeper after the children they end, and ``export-finalize`` as
the safety net: they write the same manifest (it is deterministic: children in id order,
outputs in path order, no timestamps), and the database lets exactly one of them make the
parent terminal. The manifest is streamed through a temporary file, a page of children at a
time, so memory does not grow with the number of children.
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Callable, Iterable
from typing import IO, Any
from uuid import UUID

from jobfence.errors import JobfenceError
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore, manifest_key, s3_url
from jobfence.store import Store, Transition
from jobfence.store.parents import Parent
from jobfence.store.types import ParentSummary

log = get_logger("jobfence.finalize")

PAGE = 1000
ZERO = UUID(int=0)


def finalize_parent(store: Store, objects: Callable[[], ObjectStore], bucket: str | None,
                    installation: str, parent_id: UUID) -> Transition | None:
    """Finalize ``parent_id`` if it is running and all its children are terminal.

    Returns the parent's transition when this call made it terminal, None otherwise (a
    child is still active, it is not a running parent, or another finalizer won)."""
    return finalize(store.parents.of(parent_id), objects, bucket, installation)


def finalize_parents_of(store: Store, objects: Callable[[], ObjectStore], bucket: str | None,
                        installation: str, done: Iterable[Transition]) -> int:
    """Finalize each parent one of whose children just became terminal, if it was the last;
    export-finalize retries whatever fails here. How many were finalized."""
    finalized = 0
    parents = {t.parent_id for t in done if t.terminal and t.parent_id is not None}
    for parent_id in sorted(parents, key=str):
        try:
            t = finalize_parent(store, objects, bucket, installation, parent_id)
        except JobfenceError as exc:
            log.warning("inline_finalize_failed", job_id=str(parent_id), error=str(exc))
            continue
        finalized += t is not None
    return finalized


def finalize(parent: Parent, objects: Callable[[], ObjectStore], bucket: str | None,
             installation: str) -> Transition | None:
    """Finalize ``parent`` (reached by id, or through the child an attempt just ended)."""
    summary = parent.summary()
    if summary is None or summary.status != "running" or summary.active:
        return None
    counts = summary.counts or {}
    total = sum(counts.values())
    ok = counts.get("succeeded", 0)
    succeeded = ok == total
    manifest = None
    if bucket:
        key = manifest_key(installation, summary.job_id)
        manifest = s3_url(bucket, key)
        with tempfile.TemporaryFile("w+b", suffix=".json") as raw:
            f = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
            _write_manifest(f, parent, summary, counts)
            f.flush()
            objects().upload_from(bucket, key, raw)
            f.detach()  # the TextIOWrapper must not close ``raw`` twice
    else:
        log.warning("manifest_skipped", job_id=str(summary.job_id),
                    reason="JOBFENCE_S3_BUCKET is not set")
    error = None
    if not succeeded:
        firsts = "; ".join(f"{e.job_id}: {e.status}: {e.error}"
                           for e in parent.first_errors())
        error = f"{total - ok} of {total} children did not succeed ({firsts})"
    reason = f"{ok}/{total} children succeeded"
    t = parent.finalize(succeeded=succeeded, manifest=manifest, reason=reason, error=error)
    if t is not None:
        log.info("parent_finalized", job_id=str(summary.job_id), status=t.status,
                 children=total, succeeded=ok, manifest=manifest)
    return t


def _input_urls(inputs: Any) -> list[str]:
    """A datum's input objects: of an S3 prefix's (``keys``), or of the files of the steps
    before its workflow step (``files``)."""
    if not isinstance(inputs, dict):
        return []
    if "files" in inputs:
        return [f["url"] for f in inputs["files"]]
    return [s3_url(inputs["bucket"], k) for k in inputs.get("keys", [])]


def _write_manifest(f: IO[str], parent: Parent, summary: ParentSummary,
                    counts: dict[str, int]) -> None:
    total = sum(counts.values())
    inputs = summary.inputs.get("url") if isinstance(summary.inputs, dict) else None
    head = {"job_id": str(summary.job_id),
            "status": "succeeded" if counts.get("succeeded", 0) == total else "failed",
            "inputs": inputs,
            "children": {"total": total, **dict(sorted(counts.items()))}}
    f.write(json.dumps(head)[:-1] + ', "items": [')
    after, first = ZERO, True
    while True:
        page = parent.children_page(after=after, limit=PAGE)
        for child in page:
            item = {"job_id": str(child.job_id), "status": child.status,
                    "attempt_id": str(child.attempt_id) if child.attempt_id else None,
                    "inputs": _input_urls(child.inputs),
                    "outputs": list(child.outputs), "error": child.error}
            f.write(("" if first else ", ") + json.dumps(item))
            first = False
        if len(page) < PAGE:
            break
        after = page[-1].job_id
    f.write("]}\n")
