"""The operator's view from the command line: `metrics` (printed, or served at /metrics,
read from the database) and `runs` (recent runs of the periodic functions)."""

from __future__ import annotations

import sys
from datetime import UTC

from jobfence import cli, metrics
from jobfence.errors import InvalidSpec


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
        args = p.parse_args(argv)
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
