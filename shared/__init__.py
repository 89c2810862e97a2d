"""jobfence: background jobs on Kubernetes with PostgreSQL as the single source of truth.

Applications enqueue, read and cancel jobs in their own transactions (``jobfence.api``)::

    import jobfence

    with conn.transaction():
        conn.execute("INSERT INTO audit ...")
        [job] = jobfence.enqueue(conn, {"actions": [{"name": "sleep",
                                                     "params": {"seconds": 1}}]})

The verbs are imported on first use: ``import jobfence`` alone costs the errors only
(the ``jobfence`` command's functions import what they need).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobfence.errors import (
    Conflict,
    Drained,
    IdempotencyConflict,
    InvalidSpec,
    JobAlreadyTerminal,
    JobfenceError,
    JobNotFound,
    NotFound,
    NotMigrated,
    ObjectStoreError,
    ResourceBusy,
    StoreError,
    StoreUnavailable,
    Unavailable,
)

if TYPE_CHECKING:
    from jobfence.api import Spec, cancel, enqueue, status
    from jobfence.spec import JobSpec

__all__ = [
    "Conflict", "Drained", "IdempotencyConflict", "InvalidSpec", "JobAlreadyTerminal",
    "JobNotFound", "JobSpec", "JobfenceError", "NotFound", "NotMigrated", "ObjectStoreError",
    "ResourceBusy", "Spec", "StoreError", "StoreUnavailable", "Unavailable", "cancel",
    "enqueue", "status",
]

_LAZY = {"enqueue": "jobfence.api", "status": "jobfence.api", "cancel": "jobfence.api",
         "Spec": "jobfence.api", "JobSpec": "jobfence.spec"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jobfence' has no attribute {name!r}")
