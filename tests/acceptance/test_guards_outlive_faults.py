"""Invariant 15 through the real CLI: one draining worker runs thirty jobs whose commands
name their processes with bytes that are not UTF-8 (the command itself, and a daemon it
leaves in a session of its own) while the server ends the worker's heartbeat connection
thirty times in a row, and two long jobs are cancelled as they run. Every plain job
succeeds in one attempt, every cancel reaches its command, no daemon escapes, and the
worker logs no crash (``bench.guard_chaos`` runs the same at 1,000 of each)."""

from __future__ import annotations

from pathlib import Path

from bench.guard_chaos import FAST, run
from tests.support import cli_env


def test_a_worker_outlives_thirty_killed_connections_and_thirty_hostile_names(
        dsn: str, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    out = run(dsn, lambda command: cli_env(dsn, command, **FAST), tmp_path, jobs=30, kills=30,
              cancel_every=15)
    assert out.ok, out.table()
    assert (out.succeeded, out.cancels_reached, out.daemons_alive) == (30, out.cancels, 0)
    assert out.kills >= 30 and out.cancels == 2
