"""The quick failover run (bench/chaos_failover.py): a few hundred jobs through the shipped
worker on a real Patroni cluster while its primary is lost (kill -9 of Patroni and the
postmaster), switched over, and frozen past the TTL; judged by evidence outside the
database (a side-effect log the commands append to, each process's log of what it was
acknowledged) and by the audit trail.

Synchronous (the supported setup, one of its workers through PgBouncer behind a forwarder
that follows the leader, two chains of jobs on exclusive resources): no violation at all.
Asynchronous, with the standbys held behind before the primary is lost: the checker must
report a violation — it can fail."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.chaos_failover import Run
from devtools.patroni import PatroniCluster
from tests.support import JOBFENCE, REPO, cli_env

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_the_synchronous_run_keeps_every_promise(patroni_sync: PatroniCluster,
                                                 tmp_path: Path) -> None:
    run = Run(patroni_sync, tmp_path / "sync", jobs=200, resources=2, pgbouncer_workers=1)
    judged = run.run(["node_loss", "switchover", "freeze"])
    print(judged.summary())
    assert judged.ok, judged.summary()
    assert judged.counts["acked finishes"] >= run.jobs
    assert judged.counts["faults"] == 3
    assert judged.counts["resource jobs"] >= 2  # judged for overlaps on their resources


def test_migrate_on_an_asynchronous_cluster_warns(patroni_async: PatroniCluster) -> None:
    done = subprocess.run([*JOBFENCE, "migrate"], env=cli_env(patroni_async.dsn), cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "replica(s) stream from this server asynchronously" in done.stderr


@pytest.mark.timeout(900)
def test_the_asynchronous_run_with_lag_before_a_node_loss_is_caught(
        patroni_async: PatroniCluster, tmp_path: Path) -> None:
    run = Run(patroni_async, tmp_path / "async", jobs=240, pause=(0.2, 0.6))
    judged = run.run(["lag_then_node_loss"])
    print(judged.summary())
    caught = (judged.violations.get("acked terminal write missing")
              or judged.violations.get("command started again after an acked finish")
              or judged.violations.get("acked claim missing from the audit trail"))
    assert caught, judged.summary()
