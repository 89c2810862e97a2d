"""What every benchmark shares: a throwaway PostgreSQL and moto server, the real CLI as a
subprocess, peak memory of a child process, and the section each benchmark contributes to
docs/BENCHMARKS.md.

Every figure is reported beside a reference measured in the same run on the same machine
(a ratio), because the machines these run on are shared and noisy.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml

from devtools import REPO
from devtools.embedded_pg import EmbeddedPostgres
from devtools.sqlconn import connect
from jobfence.store.migrations import migrate

JOBFENCE = [sys.executable, "-m", "jobfence.functions.cli"]


@dataclass
class Section:
    """One benchmark's part of docs/BENCHMARKS.md."""

    title: str
    command: str
    header: Sequence[str]
    rows: list[Sequence[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        out = [f"## {self.title}", "", f"`{self.command}`", ""]
        out.append("| " + " | ".join(self.header) + " |")
        out.append("|" + "|".join("---" for _ in self.header) + "|")
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in self.rows]
        if self.notes:
            out.append("")
            out += self.notes
        return "\n".join(out) + "\n"


def create_database(pg: EmbeddedPostgres, name: str, *, migrated: bool = True) -> str:
    """A fresh database on ``pg`` (dropped first if it exists), migrated unless told not to;
    its URL."""
    with psycopg.connect(pg.dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = pg.url(name)
    if migrated:
        conn = connect(url)
        try:
            migrate(conn)
        finally:
            conn.close()
    return url


class Bench:
    """One server for the whole run; a fresh migrated database per benchmark."""

    def __init__(self, pg: EmbeddedPostgres, quick: bool,
                 against: Sequence[str] | None = None, rounds: int | None = None) -> None:
        self.pg = pg
        self.quick = quick
        self.against = list(against) if against else None
        """Another jobfence's command (``python -m jobfence.functions.cli`` of an earlier
        checkout's environment), measured beside this one where a benchmark supports it:
        before and after, alternated in one run."""
        self.rounds = rounds
        """Alternated rounds where a benchmark takes medians (None: its own default)."""
        self._n = 0

    def versions(self) -> dict[str, Sequence[str]]:
        """The jobfence commands a benchmark measures, by the prefix of their columns: this
        checkout's alone, or (``--against``) an earlier one's before it."""
        if self.against:
            return {"before: ": self.against, "after: ": JOBFENCE}
        return {"": JOBFENCE}

    def noop_jobs(self, pg: EmbeddedPostgres, name: str, jobs: int,
                  command: Sequence[str] = JOBFENCE) -> tuple[str, dict[str, str]]:
        """A fresh database ``name`` on ``pg`` migrated by ``command`` (a checkout's database
        functions are part of what it measures) and ``jobs`` no-op jobs enqueued by it; its
        URL and the deployed environment of a process using it."""
        dsn = create_database(pg, name, migrated=False)
        env = self.deployed_env(dsn)
        subprocess.run([*command, "migrate"], env=env, cwd=REPO, capture_output=True,
                       check=True)
        spec = [{"actions": [{"name": "sleep", "params": {"seconds": 0}}]}] * jobs
        subprocess.run([*command, "enqueue", "--spec", "-"], input=json.dumps(spec), env=env,
                       cwd=REPO, capture_output=True, text=True, check=True)
        return dsn, env

    def database(self, *, migrated: bool = True) -> str:
        self._n += 1
        return create_database(self.pg, f"bench_{os.getpid()}_{self._n}", migrated=migrated)

    def deployed_env(self, dsn: str) -> dict[str, str]:
        """The environment of a jobfence process as the shipped manifests configure it: the
        log settings of manifests/config.yaml and the default log level (info)."""
        env = self.env(dsn, **shipped_log_settings())
        env.pop("JOBFENCE_LOG_LEVEL")
        return env

    def env(self, dsn: str, **extra: str) -> dict[str, str]:
        """The environment of a jobfence process. Bytecode is cached, as in the image, where
        pip compiled it at install time: a machine that sets PYTHONDONTWRITEBYTECODE would
        otherwise recompile jobfence's modules on every start-up and bill it to cold start
        (installed packages have theirs from pip)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("JOBFENCE_") and k != "PYTHONDONTWRITEBYTECODE"}
        env.pop("PYTHONPATH", None)
        # A command runs as the worker's own user, as in a pod (non-root: no switch); a root
        # worker here would otherwise hand it to `nobody`, who cannot reach the benchmark's
        # temporary files.
        env.update({"JOBFENCE_DATABASE_URL": dsn, "JOBFENCE_COMMAND_USER": "worker",
                    "JOBFENCE_LOG_LEVEL": "warning", **extra})
        return env


def shipped_log_settings() -> dict[str, str]:
    """The JOBFENCE_LOG_* settings manifests/config.yaml gives every pod."""
    config = next(d for d in yaml.safe_load_all((REPO / "manifests" / "config.yaml").read_text())
                  if d["metadata"]["name"] == "jobfence-config")["data"]
    return {k: str(v) for k, v in config.items() if k.startswith("JOBFENCE_LOG")}


@contextlib.contextmanager
def postgres(**settings: str) -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres(settings=settings or None) as pg:
        yield pg


def peak_rss_mb(cmd: Sequence[str], env: dict[str, str], input: bytes | None = None,
                timeout: float = 900) -> tuple[int, float, float, bytes, bytes]:
    """Run a child to completion through bench/peak.py and read its own peak resident
    memory: (exit code, seconds, peak RSS in MB, stdout, stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        rss = Path(tmp) / "rss"
        started = time.perf_counter()
        r = subprocess.run([sys.executable, str(REPO / "bench" / "peak.py"), str(rss), *cmd],
                           env=env, cwd=REPO, input=input, capture_output=True,
                           timeout=timeout, check=False)
        seconds = time.perf_counter() - started
        return r.returncode, seconds, int(rss.read_text()) / 1024, r.stdout, r.stderr


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def p95(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]
