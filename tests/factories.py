"""Small builders for tests."""

from __future__ import annotations

from typing import Any
from uuid import UUID

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
