"""`make bench`: run the benchmarks and write docs/BENCHMARKS.md.

    python -m bench.run                 # everything, full size
    python -m bench.run --quick         # smaller sizes, for a smoke run
    python -m bench.run --only sigterm listing

Each benchmark module in ``BENCHMARKS`` has ``run(bench) -> Section``; sections are written
in this order, with the machine they ran on and the command that reproduces them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common import REPO, Bench, Section, postgres

BENCHMARKS = {
    "throughput": "bench.bench_throughput",
    "history": "bench.bench_history",
    "fairness": "bench.bench_fairness",
    "sigterm": "bench.bench_sigterm",
    "latency": "bench.bench_latency",
    "arrivals": "bench.bench_arrivals",
    "statements": "bench.bench_statements",
    "cancel": "bench.bench_cancel",
    "reclaim": "bench.bench_reclaim",
    "coldstart": "bench.bench_coldstart",
    "reconciliation_memory": "bench.bench_reconciliation_memory",
    "retention": "bench.bench_retention",
    "listing": "bench.bench_listing",
    "enqueue": "bench.bench_enqueue",
    "dependents": "bench.bench_dependents",
    "handoff": "bench.bench_handoff",
    "finalize": "bench.bench_finalize",
    "output": "bench.bench_output",
    "pools": "bench.bench_pools",
    "pooler": "bench.bench_pooler",
    "sidecar": "bench.bench_sidecar",
    "console": "bench.bench_console",
    "metrics": "bench.bench_metrics",
    "schedules": "bench.bench_schedules",
    "bulk": "bench.bench_bulk",
    "controlplane": "bench.bench_controlplane",
    "keda": "bench.bench_keda",
    "keda_build": "bench.bench_keda_build",
    "image": "bench.bench_image",
    "replication": "bench.bench_replication",
}

OUT = REPO / "docs" / "BENCHMARKS.md"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    pg = subprocess.run(["psql", "--version"], capture_output=True, text=True,
                        check=False).stdout.strip() or "PostgreSQL"
    return (f"{os.cpu_count()} cores ({cpu}){mem}; {platform.system()} "
            f"{platform.release()}; Python {platform.python_version()}; {pg}")


def merge(old: str, new: dict[str, str]) -> list[str]:
    """The sections of ``old`` (a BENCHMARKS.md) with those whose command line is a key of
    ``new`` replaced by its value, and the rest of ``new`` appended, in order."""
    kept: list[str] = []
    for part in old.split("\n## ")[1:]:
        text = "## " + part.rstrip("\n") + "\n"
        command = next((ln.split("`")[1] for ln in text.splitlines()
                        if ln.startswith("`python -m bench.run")), None)
        kept.append(new.pop(command) if command in new else text)
    return kept + list(new.values())


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    p.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    p.add_argument("--out", type=Path, default=OUT, help="where to write the results")
    p.add_argument("--against", metavar="PYTHON",
                   help="also measure the jobfence installed in this interpreter's "
                        "environment (an earlier checkout), alternated with this one, where "
                        "a benchmark supports it (throughput)")
    p.add_argument("--rounds", type=int, metavar="N",
                   help="alternated rounds of the benchmarks that take medians")
    p.add_argument("--list", action="store_true",
                   help="import every benchmark, print their names, measure nothing")
    args = p.parse_args()
    if args.list:
        for name, module in BENCHMARKS.items():
            if not callable(getattr(importlib.import_module(module), "run", None)):
                raise SystemExit(f"{module} has no run(bench)")
            print(name)
        return 0
    names = args.only or list(BENCHMARKS)
    sections: list[Section] = []
    started = time.monotonic()
    with postgres() as pg:
        against = [args.against, "-m", "jobfence.functions.cli"] if args.against else None
        bench = Bench(pg, args.quick, against, args.rounds)
        for name in names:
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            section = importlib.import_module(BENCHMARKS[name]).run(bench)
            sections.append(section)
            print(section.markdown(), flush=True)
            print(f"bench: {name} took {time.monotonic() - t0:.0f}s", file=sys.stderr)
    head = ["# Benchmarks", "",
            f"Measured {datetime.now(UTC):%Y-%m-%d} on {machine()}.", "",
            "Every figure is a ratio against a reference measured in the same run on the same "
            "machine and server (a throwaway cluster from the local PostgreSQL binaries, "
            "`fsync=off`; the throughput section runs on a durable one), because the machines "
            "are shared and noisy. Reproduce with "
            f"`make bench` (`python -m bench.run{' --quick' if args.quick else ''}`); "
            f"this run took {time.monotonic() - started:.0f} s.", ""]
    body = [s.markdown() for s in sections]
    if args.only and args.out.exists():
        # A partial run replaces its own sections and keeps the others' figures.
        stamp = f"(measured {datetime.now(UTC):%Y-%m-%d}{', --quick' if args.quick else ''})"
        body = merge(args.out.read_text(), {s.command: s.markdown().replace(
            f"`{s.command}`", f"`{s.command}` {stamp}", 1) for s in sections})
        head[2] = (f"Sections measured on {machine()}; a section rerun on its own says "
                   "when.")
        head[4] = head[4].split(" Reproduce with")[0] + (
            " Reproduce everything with `make bench` (`python -m bench.run`), or one section "
            "with the command under its title.")
    args.out.write_text("\n".join(head) + "\n" + "\n".join(body))
    print(f"bench: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
