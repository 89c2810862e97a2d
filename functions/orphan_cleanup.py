"""orphan-cleanup: the periodic pass ``jobfence.passes.orphan_cleanup`` (what it does, its
options and the counts it reports are there), run by the wing's harness: its lease, its run
record, its report and metrics."""

from __future__ import annotations

import sys

from jobfence.passes import orphan_cleanup
from jobfence.passes.harness import run_pass


def main(argv: list[str] | None = None) -> int:
    return run_pass("orphan-cleanup", sys.argv[1:] if argv is None else argv,
                    orphan_cleanup.run_once, orphan_cleanup.__doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
