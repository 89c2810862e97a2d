"""runs: recent runs of the periodic functions, newest first — trigger (and who and why,
for a run started by hand), status, duration, counts, error; or — ``runs --wait FUNCTION``
— the function's next successful run, waited for."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC

from jobfence import cli
from jobfence.cluster import PERIODIC_FUNCTIONS
from jobfence.errors import InvalidSpec, WaitTimeout
from jobfence.limits import MAX_WAIT_SECONDS
from jobfence.store import Store
from jobfence.store.runs import FunctionRun

RUN_STATUSES = ("running", "succeeded", "failed", "interrupted", "skipped")

WAIT_TIMEOUT = 600.0
"""`runs --wait`'s default timeout: a period of the slowest shipped schedule (orphan-cleanup,
every 10 minutes). A run under way when the wait begins does not count, so the wait may
take up to two periods: give --timeout for that."""

WAIT_INTERVAL = 2.0


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence runs", description="Recent runs of the periodic "
                       "functions, newest first: trigger (and who and why, for a run "
                       "started by hand), status, duration, counts, error.")
        p.add_argument("--function", metavar="NAME")
        p.add_argument("--status", choices=RUN_STATUSES)
        p.add_argument("--limit", type=int, default=20)
        p.add_argument("-o", "--output", choices=["text", "json"], default="text")
        p.add_argument("--wait", metavar="FUNCTION", help="wait for the function's next "
                       "successful run (one that begins after this command), print it as "
                       "JSON; exit 7 if none has by --timeout")
        p.add_argument("--timeout", type=float, metavar="SECONDS",
                       help=f"with --wait (default {WAIT_TIMEOUT:g})")
        p.add_argument("--interval", type=float, metavar="SECONDS",
                       help=f"with --wait: how often to look (default {WAIT_INTERVAL:g})")
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.wait is not None:
            return _wait(args)
        if args.timeout is not None or args.interval is not None:
            raise InvalidSpec("--timeout and --interval go with --wait FUNCTION")
        if not 1 <= args.limit <= 1000:
            raise InvalidSpec("--limit must be between 1 and 1000")
        settings = cli.setup("runs")
        with cli.open_store(settings, "runs") as store:
            runs = store.runs.recent(function=args.function, status=args.status,
                                     limit=args.limit)
        if args.output == "json":
            cli.emit(runs)
            return 0
        print(f"{'RUN':>8}  {'FUNCTION':<16}  {'STARTED (UTC)':<19}  {'STATUS':<11}  "
              f"{'TOOK':>7}  TRIGGER")
        for r in runs:
            took = f"{r.duration_seconds:.1f}s" if r.duration_seconds is not None else "-"
            who = (f" by {r.triggered_by}" if r.triggered_by else "") + (
                f": {r.trigger_reason}" if r.trigger_reason else "")
            print(f"{r.run_id:>8}  {r.function[:16]:<16}  "
                  f"{r.started_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}  {r.status:<11}  "
                  f"{took:>7}  {r.trigger}{who}")
            if r.error:
                print(f"{'':>10}error: {' '.join(r.error.split())[:200]}")
        return 0

    return cli.run_command("runs", body)


def _wait(args: argparse.Namespace) -> int:
    """`runs --wait FUNCTION`: the design's end-to-end helper. Waits for a run of FUNCTION
    that begins after this command starts and succeeds — a run already under way when it
    starts does not count (it may have begun before what the caller wants seen) — and
    prints it. Runs that fail or are interrupted meanwhile are said on stderr, and the wait
    goes on."""
    function = args.wait
    if function not in PERIODIC_FUNCTIONS:
        raise InvalidSpec(f"--wait: {function[:80]!r} is not a periodic function (one of "
                          f"{', '.join(PERIODIC_FUNCTIONS)})")
    if args.function is not None or args.status is not None:
        raise InvalidSpec("--wait FUNCTION waits for one function's next success: "
                          "--function and --status do not go with it")
    timeout = WAIT_TIMEOUT if args.timeout is None else args.timeout
    interval = WAIT_INTERVAL if args.interval is None else args.interval
    if not 0 <= timeout <= MAX_WAIT_SECONDS:
        raise InvalidSpec(f"--timeout must be between 0 and {MAX_WAIT_SECONDS:g} seconds")
    if not 0.01 <= interval <= 3600:
        raise InvalidSpec("--interval must be between 0.01 and 3600 seconds")
    settings = cli.setup("runs")
    with cli.open_store(settings, "runs") as store:
        run = next_success(store, function, time.monotonic() + timeout, interval)
    if run is None:
        raise WaitTimeout(f"no run of {function} begun after this command succeeded within "
                          f"{timeout:g}s")
    cli.emit(run)
    return 0


def next_success(store: Store, function: str, deadline: float,
                 interval: float) -> FunctionRun | None:
    """The first run of ``function`` begun from now on that succeeds; None at
    ``deadline`` (a ``time.monotonic()``). Looks every ``interval`` seconds: a run record is
    one indexed row, and a periodic function runs at most every minute."""
    after = store.runs.latest_run_id()
    said: set[int] = set()
    while True:
        for run in store.runs.runs_after(function=function, after=after):
            if run.status == "succeeded":
                return run
            if run.status in ("failed", "interrupted") and run.run_id not in said:
                said.add(run.run_id)
                why = " ".join((run.error or "").split())[:200]
                cli.warn(f"run {run.run_id} of {function} {run.status}"
                         + (f": {why}" if why else "") + "; still waiting for a success")
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(interval, left))


if __name__ == "__main__":
    sys.exit(main())
