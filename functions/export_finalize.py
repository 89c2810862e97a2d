"""export-finalize: the periodic pass ``jobfence.passes.export_finalize`` (what it does, its
options and the counts it reports are there), run by the wing's harness: its lease, its run
record, its report and metrics."""

from __future__ import annotations

import sys

from jobfence.passes import export_finalize
from jobfence.passes.harness import run_pass


def main(argv: list[str] | None = None) -> int:
    return run_pass("export-finalize", sys.argv[1:] if argv is None else argv,
                    export_finalize.run_once, export_finalize.__doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
