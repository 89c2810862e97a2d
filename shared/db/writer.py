"""Keeping jobfence on the writer across a failover: a multi-host URL reaches only the
primary; a connection that answered it takes no writes (SQLSTATE 25006), or whose commit's
wait for its synchronous standby was cancelled (PostgreSQL then reports success with a
WARNING), is marked stale and replaced by its owner before its next use. Part of the
database module (``jobfence.db``), the one place that imports psycopg.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from jobfence.errors import NotWriter, Unreplicated


def writer_params(dsn: str) -> dict[str, Any]:
    """What a connection string needs to keep jobfence off a replica: a URL naming several
    hosts (a failover set) gets ``target_session_attrs=read-write`` unless it says
    otherwise, so libpq skips every host that is a replica or read-only. One host is taken
    as given (a service that follows the primary, or PgBouncer): a write that reaches a
    replica there is refused (``NotWriter``) and the connection replaced."""
    with contextlib.suppress(Exception):
        params = conninfo_to_dict(dsn)
        if "," in str(params.get("host") or params.get("hostaddr") or "") \
                and "target_session_attrs" not in params:
            return {"target_session_attrs": "read-write"}
    return {}


def no_writer(exc: psycopg.Error) -> bool:
    """Whether libpq refused every host for being read-only (target_session_attrs)."""
    text = str(exc)
    return "read-only" in text or "hot standby" in text


# Connections jobfence must not use again (they answered that they take no writes, or a
# commit on them was not confirmed replicated), and connections whose last statement's
# commit the server reported with a cancelled synchronous-replication wait. Weak: a
# connection forgotten by its owner leaves them.
_stale: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
_unreplicated: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()


def watch(conn: psycopg.Connection[Any]) -> None:
    """Listen on ``conn`` for the WARNING with which PostgreSQL reports a commit whose wait
    for its synchronous standby was cancelled (it then reports success): the next check
    (``execute``, ``transaction``, ``pipeline``) raises ``Unreplicated`` instead."""
    ref = weakref.ref(conn)

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        text = f"{diag.message_primary or ''} {diag.message_detail or ''}"
        if "synchronous replication" in text or "replicated to the standby" in text:
            found = ref()
            if found is not None:
                _unreplicated.add(found)

    conn.add_notice_handler(on_notice)


def stale(conn: psycopg.Connection[Any]) -> bool:
    """Whether ``conn`` must be replaced before its next use: closed, broken, or found on a
    server that takes no writes (or with a commit not confirmed replicated)."""
    return conn.closed or conn.broken or conn in _stale


def check_replicated(conn: psycopg.Connection[Any]) -> None:
    if conn in _unreplicated:
        _unreplicated.discard(conn)
        mark_stale(conn)
        raise Unreplicated("database unavailable: the commit's wait for its synchronous "
                           "standby was cancelled: it may not survive a failover (outcome "
                           "unknown)")


@contextmanager
def replacing(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Mark ``conn`` stale when what ran on it was refused for want of a writer."""
    try:
        yield
    except NotWriter:
        mark_stale(conn)
        raise


def mark_stale(conn: psycopg.Connection[Any]) -> None:
    """``conn`` must not be used again: its owner replaces it (``stale``)."""
    _stale.add(conn)
