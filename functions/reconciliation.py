"""reconciliation: the periodic pass ``jobfence.passes.reconciliation`` (what it does, its
options and the counts it reports are there), run by the wing's harness: its lease, its run
record, its report and metrics."""

from __future__ import annotations

import sys

from jobfence.passes import reconciliation
from jobfence.passes.harness import run_pass


def main(argv: list[str] | None = None) -> int:
    return run_pass("reconciliation", sys.argv[1:] if argv is None else argv,
                    reconciliation.run_once, reconciliation.__doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
