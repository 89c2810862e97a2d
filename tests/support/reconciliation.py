"""Reconciliation of the local cluster (worker processes on this machine), run from the
outside: the real ``jobfence reconciliation`` as a subprocess, and the installation a worker
must be started with for the pass to judge it."""

from __future__ import annotations

import json

from devtools.sqlconn import connect
from jobfence.store import Store
from tests.support import run_cli

LOCAL = {"JOBFENCE_CLUSTER": "local", "JOBFENCE_RECONCILE_GRACE_SECONDS": "0",
         "JOBFENCE_RETRY_BASE_SECONDS": "0"}
"""The local cluster, judged without a grace period, retries due at once."""


def reconcile(dsn: str) -> dict[str, object]:
    """One reconciliation pass over the local cluster; its report."""
    r = run_cli(dsn, "reconciliation", **LOCAL)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def installation(dsn: str) -> str:
    """The installation of the database at ``dsn``."""
    with connect(dsn) as conn:
        return str(Store(conn).control.identity().installation)
