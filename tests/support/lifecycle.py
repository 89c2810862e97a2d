"""The lifecycle pass on the real store with an injected clock (no sleeping for TTLs), as the
tests of its timeouts, expiries and retention run it: settings without retry back-off, an
in-memory object store's bucket, and the database's own clock to move from."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import jobfence.passes.lifecycle as lifecycle
from devtools.memory_objects import MemoryObjectStore
from jobfence.passes.harness import Deps
from jobfence.settings import Settings, load_settings
from jobfence.store import Store

BUCKET = "out"
HOUR = timedelta(hours=1)


def settings(dsn: str, **kw: Any) -> Settings:
    kw.setdefault("retry_base_seconds", 0)
    return load_settings(database_url=dsn, **kw)


def run(store: Store, dsn: str, now: datetime | None = None,
        objects: MemoryObjectStore | None = None, **kw: Any) -> lifecycle.Report:
    """One lifecycle pass at ``now`` (the objects, when given, in ``BUCKET``)."""
    s = settings(dsn, **({"s3_bucket": BUCKET} | kw if objects is not None else kw))
    return lifecycle.run_once(s, Deps(store, s, object_store=objects, now=now))


def db_now(store: Store) -> datetime:
    """The database's clock (the one the pass's ``now`` is compared with)."""
    row = store.conn.execute("SELECT now() AS now").fetchone()
    assert row is not None
    return row["now"]  # type: ignore[no-any-return]
