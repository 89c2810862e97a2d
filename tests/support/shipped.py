"""The migrations as installed databases ran them. Before 0038 a migration defined the
functions, triggers and views of its day; since then their live definitions are the
function files (``store/<noun>.functions.sql``), and the migrations before 0038 keep only
their tables, columns, indexes and data. An installation that ran one of those migrations
ran it whole: the upgrade tests build each earlier head from these texts, as shipped."""

from __future__ import annotations

from pathlib import Path
from typing import LiteralString, cast

from jobfence.store.migrations import Migration, available

SHIPPED = Path(__file__).with_name("shipped_schema")
"""The migrations whose function definitions were taken out, as they were shipped."""


def shipped_migrations() -> list[Migration]:
    """Every migration as the release that first shipped it had it."""
    out = []
    for mig in available():
        path = SHIPPED / f"{mig.version:04d}_{mig.name}.sql"
        out.append(Migration(mig.version, mig.name, cast(LiteralString, path.read_text()))
                   if path.exists() else mig)
    return out
