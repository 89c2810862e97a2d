"""Numbered schema migrations (``sql/migrations/NNNN_name.sql``), applied in order.

Every migration runs in its own transaction together with its bookkeeping row, under an
advisory lock: two pods running ``jobfence migrate`` at once apply each migration exactly
once, and the second simply finds nothing left to do. Migrations must be additive, because
a rolling deploy runs old and new pods against the same schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import LiteralString

from shared.db import Connection, advisory_lock, translated
from shared.queries import QUERIES

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: LiteralString


@dataclass(frozen=True, slots=True)
class MigrateReport:
    applied: tuple[str, ...]
    already: int

    @property
    def current(self) -> int:
        return self.already + len(self.applied)


def available() -> list[Migration]:
    """Every migration shipped with this version, in order."""
    found = []
    for entry in resources.files("shared.sql.migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m[1]), m[2], entry.read_text("utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, got {versions}")
    return found


def migrate(conn: Connection) -> MigrateReport:
    """Apply every migration not applied yet; safe to run repeatedly and concurrently."""
    with translated(), advisory_lock(conn, "migrate"):
        conn.execute(QUERIES["migrations_table_create"])
        done = {row["version"] for row in conn.execute(QUERIES["migrations_applied"])}
        applied = []
        for mig in available():
            if mig.version in done:
                continue
            with conn.transaction():
                # The file is part of this package, never input.
                conn.execute(mig.sql)
                conn.execute(QUERIES["migration_record"],
                             {"version": mig.version, "name": mig.name})
            applied.append(f"{mig.version:04d}_{mig.name}")
        return MigrateReport(applied=tuple(applied), already=len(done))
