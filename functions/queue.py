"""queue: a queue's state and settings — status (paused, limit, rate, pending, scheduled,
running), pause (it keeps accepting jobs, claims none), resume, limit (at most N running
jobs of the queue across every pod; --per-group: of each group), rate (at most N of its
jobs start in any window of a period), fair (claims round-robin across its groups) and
groups (each group's jobs). Each change is audited with who made it."""

from __future__ import annotations

import sys

from jobfence import cli
from jobfence.durations import parse_rate
from jobfence.errors import InvalidSpec
from jobfence.views import empty_queue_view, group_view, queue_view

QUEUE_FIELDS = ("queue", "paused", "limit", "pending", "scheduled", "running")
"""The JSON object of one queue, exactly (docs/REFERENCE.md); its rate is in the text table,
the API's queues and the metrics."""


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence queue", description="A queue's state and settings: "
                       "pause (it keeps accepting jobs, claims none), resume, and limit "
                       "(at most N running jobs of the queue across every pod), rate (at most "
                       "N of its jobs start in any window of a period).")
        sub = p.add_subparsers(dest="verb", required=True,
                               metavar="status|pause|resume|limit|rate|fair|groups")
        status = sub.add_parser("status", help="paused, limit, pending, scheduled, running")
        status.add_argument("queue", nargs="?")
        status.add_argument("-o", "--output", choices=["text", "json"], default="text")
        pause = sub.add_parser("pause", help="claim nothing from the queue")
        pause.add_argument("queue")
        pause.add_argument("--reason")
        resume = sub.add_parser("resume", help="claim from the queue again")
        resume.add_argument("queue")
        limit = sub.add_parser("limit", help="at most N running jobs of the queue")
        limit.add_argument("queue")
        limit.add_argument("n", metavar="N|none")
        limit.add_argument("--per-group", action="store_true",
                           help="at most N running jobs of each group of the queue")
        rate = sub.add_parser("rate", help="at most N of the queue's jobs start per period")
        rate.add_argument("queue")
        rate.add_argument("rate", metavar="N/PERIOD|none",
                          help="e.g. 60/minute, 5/PT10S (ISO 8601), none")
        fair = sub.add_parser("fair", help="claim round-robin across the queue's groups")
        fair.add_argument("queue")
        fair.add_argument("state", choices=["on", "off"])
        groups = sub.add_parser("groups", help="each group's pending, scheduled, running "
                                "and waiting jobs")
        groups.add_argument("queue")
        groups.add_argument("-o", "--output", choices=["text", "json"], default="text")
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        queue = cli.queue_of(args.queue) if args.queue is not None else None
        n: int | None = None
        if args.verb == "limit" and args.n != "none":
            if not args.n.isdigit() or not 0 <= int(args.n) <= 1_000_000:
                raise InvalidSpec(f"limit {args.n[:40]!r}: give a number from 0 to 1000000, "
                                  "or none")
            n = int(args.n)
        per: tuple[int, float] | tuple[None, None] = (None, None)
        if args.verb == "rate" and args.rate != "none":
            try:
                per = parse_rate(args.rate)
            except ValueError as exc:
                raise InvalidSpec(str(exc)) from None
        settings = cli.setup("queue")
        with cli.open_store(settings, "queue") as store:
            if args.verb == "pause":
                store.queues.configure(str(queue), paused=True, reason=args.reason,
                                       actor=cli.actor())
            elif args.verb == "resume":
                store.queues.configure(str(queue), paused=False, actor=cli.actor())
            elif args.verb == "limit" and args.per_group:
                store.queues.set_groups(str(queue), group_limit=n, set_group_limit=True,
                                        actor=cli.actor())
            elif args.verb == "limit":
                store.queues.configure(str(queue), limit=n, set_limit=True,
                                       actor=cli.actor())
            elif args.verb == "fair":
                store.queues.set_groups(str(queue), fair=args.state == "on",
                                        actor=cli.actor())
            elif args.verb == "groups":
                return _groups(str(queue), [group_view(g) for g in
                                            store.queues.groups(str(queue))], args.output)
            elif args.verb == "rate":
                store.queues.rate(str(queue), *per, actor=cli.actor())
            rows = store.queues.status(queue)
        views = [queue_view(r) for r in rows] or [empty_queue_view(str(queue))]
        if args.verb == "status" and args.output == "text":
            _print_queues(views)
            return 0
        objects = [{k: v[k] for k in QUEUE_FIELDS} for v in views]
        cli.emit(objects[0] if queue is not None else objects)
        return 0

    return cli.run_command("queue", body)


def _groups(queue: str, groups: list[dict[str, object]], output: str) -> int:
    if output == "json":
        cli.emit({"queue": queue, "groups": groups})
        return 0
    print(f"{'GROUP':<40} {'PENDING':>8} {'SCHEDULED':>9} {'RUNNING':>8} {'WAITING':>8}")
    for g in groups:
        name = "(none)" if g["group"] is None else str(g["group"])
        print(f"{name:<40} {g['pending']:>8} {g['scheduled']:>9} {g['running']:>8} "
              f"{g['waiting']:>8}")
    return 0


def _print_queues(views: list[dict[str, object]]) -> None:
    print(f"{'QUEUE':<24} {'STATE':<7} {'LIMIT':>6} {'PER GROUP':>9} {'FAIR':>4} "
          f"{'RATE':>14} {'PENDING':>8} {'SCHEDULED':>9} {'RUNNING':>8} {'WAITING':>8} "
          f"{'OLDEST READY':>12}")
    for v in views:
        limit = "-" if v["limit"] is None else str(v["limit"])
        per_group = "-" if v["group_limit"] is None else str(v["group_limit"])
        r = v["rate"]
        rate = "-" if not isinstance(r, dict) else \
            f"{r['started']}/{r['limit']} per {r['period_seconds']:g}s"
        age = float(str(v["oldest_ready_age_seconds"]))
        print(f"{v['queue']!s:<24} {'paused' if v['paused'] else 'active':<7} {limit:>6} "
              f"{per_group:>9} {'on' if v['fair'] else 'off':>4} {rate:>14} "
              f"{v['pending']:>8} {v['scheduled']:>9} {v['running']:>8} {v['waiting']:>8} "
              f"{age:>11.0f}s")


if __name__ == "__main__":
    sys.exit(main())
