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


def run_in_progress(store: Store, function: str, lease_seconds: float = 300) -> UUID:
    """A run of ``function`` holding its lease (as a pass in progress elsewhere would); the
    holder's id."""
    holder = uuid7()
    assert store.runs.run_started(function=function, trigger="manual", holder=holder,
                                  lease_seconds=lease_seconds) is not None
    return holder
