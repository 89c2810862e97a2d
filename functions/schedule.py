"""schedule: users' own periodic work — add, list, show, pause, resume, delete. A schedule
enqueues one job spec at every tick of a cron expression in a time zone; the ``schedules``
CronJob does the enqueueing, each tick exactly once. A cron expression that never fires, an
unknown time zone or an invalid spec is exit 2, nothing written."""

from __future__ import annotations

import sys
from typing import Any

from jobfence import cli
from jobfence.errors import InvalidSpec
from jobfence.limits import MAX_SPEC_BYTES
from jobfence.schedules import Cron, job_template, schedule_name, schedule_spec
from jobfence.spec import decode_spec_bytes, load_spec_text
from jobfence.views import schedule_view

VERBS = "add|list|show|pause|resume|delete"


def parser() -> cli.Parser:
    p = cli.Parser(prog="jobfence schedule", description=__doc__)
    sub = p.add_subparsers(dest="verb", required=True, metavar=VERBS)
    add = sub.add_parser("add", help="a new schedule: a cron expression and a job spec")
    add.add_argument("name")
    add.add_argument("--cron", required=True, metavar="EXPR",
                     help="five fields: minute hour day-of-month month day-of-week")
    add.add_argument("--timezone", default="UTC", metavar="TZ",
                     help="the time zone the expression reads in (default UTC)")
    add.add_argument("--spec", required=True, metavar="FILE",
                     help="one JSON or YAML job spec; - for stdin")
    add.add_argument("-o", "--output", choices=["text", "json"], default="json")
    ls = sub.add_parser("list", help="every schedule")
    ls.add_argument("-o", "--output", choices=["text", "json"], default="text")
    for verb, what in (("show", "one schedule and its recent ticks"),
                       ("pause", "enqueue nothing until resumed"),
                       ("resume", "enqueue again from the next tick"),
                       ("delete", "delete the schedule (its jobs stay)")):
        s = sub.add_parser(verb, help=what)
        s.add_argument("name")
        s.add_argument("-o", "--output", choices=["text", "json"],
                       default="text" if verb == "show" else "json")
    return p


def _read_spec(path: str) -> object:
    source = "stdin" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_SPEC_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise InvalidSpec(f"cannot read spec {source!r}: {exc.strerror}") from None
    return load_spec_text(decode_spec_bytes(data, source), source)


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'NAME':<24} {'STATE':<7} {'CRON':<18} {'TIMEZONE':<18} {'NEXT TICK':<26} "
          "LAST JOB")
    for r in rows:
        nxt = r["next_tick_at"].isoformat() if r["next_tick_at"] else "-"
        print(f"{r['name']:<24} {'paused' if r['paused'] else 'active':<7} {r['cron']:<18} "
              f"{r['timezone']:<18} {nxt:<26} {r['last_job_id'] or '-'}")


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        name = schedule_name(args.name) if getattr(args, "name", None) is not None else ""
        if args.verb == "add":  # everything checked before the database is reached
            cron = Cron.parse(args.cron, args.timezone)
            spec, shown = schedule_spec(_read_spec(args.spec))
        settings = cli.setup("schedule")
        with cli.open_store(settings, "schedule") as store:
            schedules = store.schedules
            if args.verb == "add":  # the first tick by the database's clock, as every tick
                first = cron.after(schedules.clock())
                assert first is not None  # Cron.parse refuses one that never fires
                row = schedules.add(name=name, cron=cron.expr, timezone=args.timezone,
                                    spec=shown, job=job_template(spec, name,
                                                                 settings.max_attempts),
                                    next_tick_at=first, actor=cli.actor())
            elif args.verb in ("pause", "resume"):
                nxt = None
                if args.verb == "resume":
                    current = schedules.get(name)
                    nxt = Cron.parse(current.cron, current.timezone).after(schedules.clock())
                row = schedules.set_paused(name=name, paused=args.verb == "pause",
                                           next_tick_at=nxt, actor=cli.actor())
            elif args.verb == "delete":
                row = schedules.delete(name=name, actor=cli.actor())
            elif args.verb == "show":
                row = schedules.get(name)
                ticks = schedules.ticks(name)
            else:
                rows, after = [], None
                while page := schedules.page(after=after):
                    rows += [schedule_view(r) for r in page]
                    after = page[-1].name
                if args.output == "json":
                    cli.emit(rows)
                else:
                    _print(rows)
                return 0
        out = schedule_view(row)
        if args.verb == "show":
            out["ticks"] = [t._asdict() for t in ticks]
            if args.output == "text":
                _print([out])
                for t in out["ticks"]:
                    print(f"  {t['tick_at'].isoformat()}  {t['outcome']:<13} "
                          f"{t['job_id'] or ''}")
                return 0
        if args.output == "text":
            _print([out])
            return 0
        cli.emit(out)
        return 0

    return cli.run_command("schedule", body)


if __name__ == "__main__":
    sys.exit(main())
