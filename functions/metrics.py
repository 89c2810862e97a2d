"""metrics: the functions', the queues' and the jobs' metrics in the Prometheus text format
(what the functions push to the Pushgateway), printed, or — ``--serve`` — served at
/metrics, read from the database on each scrape."""

from __future__ import annotations

import sys

from jobfence import cli, metrics
from jobfence.errors import InvalidSpec


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence metrics", description="Print the functions', the "
                       "queues' and the jobs' metrics in the Prometheus text format (what "
                       "the functions push to the Pushgateway), or serve them, read from "
                       "the database on each scrape.")
        p.add_argument("--serve", action="store_true",
                       help="serve them at http://HOST:PORT/metrics until SIGTERM")
        p.add_argument("--host", default="0.0.0.0", help="with --serve (default 0.0.0.0)")  # noqa: S104
        p.add_argument("--port", type=int, default=9464, help="with --serve (default 9464)")
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
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


if __name__ == "__main__":
    sys.exit(main())
