"""Small builders for tests."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

from devtools import REPO
from jobfence.ids import uuid7
from jobfence.store import NewJob, Store


def new_job(**kw: Any) -> NewJob:
    kw.setdefault("job_id", uuid7())
    kw.setdefault("actions", [{"name": "sleep", "params": {"seconds": 0}}])
    kw.setdefault("max_attempts", 3)
    return NewJob(**kw)


def enqueue_one(store: Store, **kw: Any) -> UUID:
    return store.jobs.enqueue([new_job(**kw)])[0].job_id


def installation(store: Store) -> str:
    """The installation the test's database belongs to."""
    return str(store.control.identity().installation)


def run_in_progress(store: Store, function: str, lease_seconds: float = 300) -> UUID:
    """A run of ``function`` holding its lease (as a pass in progress elsewhere would); the
    holder's id."""
    holder = uuid7()
    assert store.runs.run_started(function=function, trigger="manual", holder=holder,
                                  lease_seconds=lease_seconds) is not None
    return holder


def make_parent(store: Store, n: int, **kw: Any) -> tuple[UUID, list[UUID]]:
    """A datum parent with ``n`` children, made by the real ``child_batches`` from a listing
    of an in-memory object store, two children inserted at a time (so every parent made here
    crosses a batch); the parent's id and its children's, in id order."""
    from devtools.memory_objects import MemoryObjectStore
    from jobfence.datums import child_batches

    inputs = MemoryObjectStore()
    for i in range(n):
        inputs.put_bytes("in", f"x/{i:04d}", b"1")
    parent = new_job(is_parent=True, inputs={"url": "s3://in/x/", "per_datum": 1}, **kw)
    [made] = store.jobs.enqueue([parent], children=child_batches("s3://in/x/", 1, inputs,
                                                                 batch_size=2))
    assert made.children == n
    kids = [c.job_id for c in store.parents.children_page(parent_id=made.job_id,
                                                          after=UUID(int=0), limit=n)]
    return made.job_id, kids


PLUGIN_DIR = REPO / "tests" / "fixtures" / "plugin"
"""A third-party action package installed the way pip installs one (tests/fixtures/plugin)."""


@contextlib.contextmanager
def plugin_installed(*paths: Path) -> Iterator[None]:
    """In this process, the action packages at ``paths`` (directories holding a module and
    its ``.dist-info``; the test plugin by default) are installed: their entry points are in
    the action registry until the block ends."""
    from jobfence import spec
    from jobfence.actions import installed

    added = [str(p) for p in (paths or (PLUGIN_DIR,))]
    sys.path[:0] = added
    installed.registry.cache_clear()
    spec._validated.cache_clear()
    try:
        yield
    finally:
        for p in added:
            sys.path.remove(p)
        installed.registry.cache_clear()
        spec._validated.cache_clear()
