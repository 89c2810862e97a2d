"""The operator's view from the command line: `metrics` (printed, or served at /metrics,
read from the database), `runs` (recent runs of the periodic functions, or — `runs
--wait FUNCTION` — the function's next successful run, waited for) and `logs` (a job's
whole output, or — `--follow` — as it comes)."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC
from uuid import UUID

from jobfence import cli, metrics
from jobfence.cluster import PERIODIC_FUNCTIONS
from jobfence.errors import InvalidSpec, WaitTimeout
from jobfence.joblogs import STREAM_NAMES, Attempt, Logs, Piece, visible
from jobfence.limits import MAX_WAIT_SECONDS
from jobfence.store import Store
from jobfence.store.types import FunctionRun
from jobfence.wiring import open_object_store


def metrics_main(argv: list[str]) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence metrics", description="Print the functions', the "
                       "queues' and the jobs' metrics in the Prometheus text format (what "
                       "the functions push to the Pushgateway), or serve them, read from "
                       "the database on each scrape.")
        p.add_argument("--serve", action="store_true",
                       help="serve them at http://HOST:PORT/metrics until SIGTERM")
        p.add_argument("--host", default="0.0.0.0", help="with --serve (default 0.0.0.0)")  # noqa: S104
        p.add_argument("--port", type=int, default=9464, help="with --serve (default 9464)")
        args = p.parse_args(argv)
        if not 0 <= args.port <= 65535:
            raise InvalidSpec("--port must be between 0 and 65535")
        settings = cli.setup("metrics")
        if args.serve:
            def ready(port: int) -> None:
                cli.emit({"serving": f"http://{args.host}:{port}/metrics"})

            metrics.serve(settings, args.host, args.port, ready)
            return 0
        with cli.open_store(settings, "metrics") as store:
            text = metrics.exposition(store, settings.retention_default)
        sys.stdout.write(text)
        return 0

    return cli.run_command("metrics", body)


RUN_STATUSES = ("running", "succeeded", "failed", "interrupted", "skipped")


def runs_main(argv: list[str]) -> int:
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
        args = p.parse_args(argv)
        if args.wait is not None:
            return wait_main(args)
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


WAIT_TIMEOUT = 600.0
"""`runs --wait`'s default timeout: a period of the slowest shipped schedule (orphan-cleanup,
every 10 minutes). A run under way when the wait begins does not count, so the wait may
take up to two periods: give --timeout for that."""

WAIT_INTERVAL = 2.0


def wait_main(args: argparse.Namespace) -> int:
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


def logs_main(argv: list[str]) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence logs", description="A job's whole output: the stdout "
                       "and stderr of each action of an attempt (the latest unless "
                       "--attempt), from S3 where it went there, else the tails kept in "
                       "the database. With one --stream, its bytes as they were written; "
                       "else each stream under a header.")
        p.add_argument("job_id")
        p.add_argument("--attempt", type=int, metavar="N", help="attempt N (from 1)")
        p.add_argument("--stream", choices=STREAM_NAMES, help="only this stream")
        p.add_argument("--action", type=int, metavar="N", help="only action N (from 1)")
        p.add_argument("-f", "--follow", action="store_true",
                       help="while the attempt runs, print what comes as it comes")
        p.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
        args = p.parse_args(argv)
        job_id = cli.job_id(args.job_id)
        if not 0.05 <= args.interval <= 60:
            raise InvalidSpec("--interval must be between 0.05 and 60 seconds")
        settings = cli.setup("logs")
        with cli.open_store(settings, "logs") as store:
            identity = store.control.identity(settings.installation)
            assert identity.installation is not None
            logs = Logs(store, (lambda: open_object_store(settings)) if settings.s3_bucket
                        else None, settings.s3_bucket, identity.installation)
            attempt = logs.attempt(job_id, args.attempt)
            printer = _Printer(logs, job_id, attempt, args.stream, args.action)
            while True:
                running = args.follow and logs.still_running(job_id, attempt)
                printer.print_new(final=not running)
                if not running:
                    return 0
                time.sleep(args.interval)

    return cli.run_command("logs", body)


class _Printer:
    """Prints each piece of an attempt's output once, and of a piece on S3 the objects
    not printed yet."""

    def __init__(self, logs: Logs, job_id: UUID, attempt: Attempt, stream: str | None,
                 action: int | None) -> None:
        self.logs, self.job_id, self.attempt = logs, job_id, attempt
        self.stream, self.action = stream, action
        self.printed: dict[tuple[int, str], int] = {}
        self.headed: tuple[int, str] | None = None
        self.out = sys.stdout.buffer
        self.terminal = sys.stdout.isatty()
        """A person reads it: a job's control characters are shown, not obeyed (piped,
        the bytes are exactly what the job wrote)."""

    def print_new(self, *, final: bool) -> None:
        for piece in self.logs.pieces(self.job_id, self.attempt):
            if (self.stream and piece.stream != self.stream) or (
                    self.action and piece.action_index != self.action - 1):
                continue
            key = (piece.action_index, piece.stream)
            if not piece.on_s3 and key in self.printed:
                continue
            for seq, data in self.logs.read(self.job_id, self.attempt, piece,
                                            after=self.printed.get(key, 0)):
                self._head(piece)
                self.out.write(visible(data) if self.terminal else data)
                self.printed[key] = seq
            if final and not piece.whole:
                self._head(piece)
                sys.stderr.write(f"jobfence logs: only the last {len(piece.tail or '')} "
                                 f"characters of action {piece.action_index + 1}'s "
                                 f"{piece.stream} were kept ({piece.size} bytes written)\n")
        self.out.flush()

    def _head(self, piece: Piece) -> None:
        key = (piece.action_index, piece.stream)
        if self.stream is None and self.headed != key:
            size = "" if piece.size is None else f", {piece.size} bytes"
            self.out.write(f"==> attempt {self.attempt.number}, action "
                           f"{piece.action_index + 1} ({piece.action}): "
                           f"{piece.stream}{size} <==\n".encode())
            self.headed = key
