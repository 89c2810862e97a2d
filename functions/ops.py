"""Operator commands over the fenced store: migrate, status, list, wait, drain, queue,
info (cancel and retry: ``retry_cancel``; schedules: ``schedule``)."""

from __future__ import annotations

import contextlib
import sys
import time
from datetime import UTC, datetime
from uuid import UUID

from jobfence import cli, db
from jobfence.db import connect
from jobfence.durations import parse_rate
from jobfence.errors import ExitCode, InvalidSpec, JobfenceError, JobNotFound, WaitTimeout
from jobfence.limits import MAX_WAIT_SECONDS
from jobfence.spec import queue_name
from jobfence.store import ACTIVE, TERMINAL, JobRow, Store
from jobfence.store.migrations import migrate
from jobfence.store.roles import connection_identity, setup_sql
from jobfence.terminal import harmless
from jobfence.views import empty_queue_view, job_views, queue_view, render_text


def migrate_main(argv: list[str]) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence migrate", description="Apply database migrations "
                       "(idempotent; safe to run from several pods at once), create the "
                       "installation's group roles when this login may, and grant each "
                       "its privileges.")
        p.add_argument("--roles-sql", action="store_true",
                       help="print the SQL a DBA runs to create the group roles when this "
                       "login may not, and change nothing")
        args = p.parse_args(argv)
        settings = cli.setup("migrate")
        conn = connect(settings.database_url, pooler=settings.database_pooler,
                       application_name="jobfence-migrate",
                       connect_timeout=settings.connect_timeout_seconds)
        try:
            if args.roles_sql:
                login, database = connection_identity(conn)
                sys.stdout.write(setup_sql(settings.schema_name, login, database))
                return 0
            report = migrate(conn, settings.schema_name, settings.installation)
            durability = Store(conn, settings.schema_name).control.durability()
        finally:
            conn.close()
        roles = report.roles
        out: dict[str, object] = {"function": "migrate", "schema": settings.schema_name,
                                  "installation": report.installation,
                                  "applied": list(report.applied), "version": report.current,
                                  "functions": list(report.functions),
                                  "roles": {"created": list(roles.created),
                                            "missing": list(roles.missing),
                                            "granted": roles.granted, "owner": roles.owner}}
        if report.relocated_from:
            out["moved_from_schema"] = report.relocated_from
        if roles.missing:
            cli.warn(f"roles {', '.join(roles.missing)} do not exist and this login may not "
                     "create them: nothing was granted, and every function needs this "
                     "login's privileges. Have a DBA run the SQL of `jobfence migrate "
                     "--roles-sql`, then run `jobfence migrate` again.")
        for why in durability:
            cli.warn(why)
        cli.emit(out)
        return 0

    return cli.run_command("migrate", body)


def status_main(argv: list[str]) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence status", description="Show one job.")
        p.add_argument("job_id")
        p.add_argument("-o", "--output", choices=["text", "json"], default="text")
        p.add_argument("--events", action="store_true", help="include the audit trail")
        p.add_argument("--reveal-env", action="store_true", help="show the values of the "
                       "actions' env (an operator's login; recorded with who asked and why)")
        p.add_argument("--reason", help="why the env values are needed (recorded)")
        args = p.parse_args(argv)
        job_id = cli.job_id(args.job_id)
        if args.reason is not None and not args.reveal_env:
            raise InvalidSpec("--reason goes with --reveal-env")
        settings = cli.setup("status")
        with cli.open_store(settings, "status") as store:
            row = store.jobs.get(job_id)
            if row is None:
                raise JobNotFound(job_id)
            view = job_views(store, [row])[0]
            if args.events:
                view["events"] = store.jobs.events(job_id)
            if args.reveal_env:
                revealed = store.jobs.reveal_env(job_id=job_id, actor=cli.actor(),
                                                 reason=args.reason or "")
                for r in revealed:
                    view["actions"][r["index"]]["params"]["env"] = r["env"]
        if args.output == "json":
            cli.emit(view)
        else:
            print(render_text(view))
            for e in view.get("events", []):  # a reason may quote a job's stderr
                print(harmless(f"    {e.at:%H:%M:%S.%f} {e.from_status or '-':>9} -> "
                               f"{e.to_status:<9} {e.reason or ''}"))
        return 0

    return cli.run_command("status", body)


def list_main(argv: list[str]) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence list", description="List jobs, newest first.")
        p.add_argument("--status", choices=[*ACTIVE, *TERMINAL])
        p.add_argument("--resource")
        p.add_argument("--parent", metavar="JOB_ID")
        p.add_argument("--queue", metavar="Q")
        p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                       help="only jobs carrying this label (repeat: all of them)")
        p.add_argument("--limit", type=int, default=50, help="jobs per page (at most 10000)")
        p.add_argument("--after", metavar="JOB_ID", help="the next page: jobs older than "
                       "this one (the last job id of the previous page)")
        p.add_argument("-o", "--output", choices=["text", "json"], default="text")
        args = p.parse_args(argv)
        if not 1 <= args.limit <= 10_000:
            raise InvalidSpec("--limit must be between 1 and 10000 (page on with --after)")
        parent = cli.job_id(args.parent) if args.parent else None
        after = cli.job_id(args.after) if args.after else None
        queue = _queue(args.queue) if args.queue else None
        labels = cli.labels_of(args.label)
        settings = cli.setup("list")
        with cli.open_store(settings, "list") as store:
            views = job_views(store, store.jobs.page(
                status=args.status, resource=args.resource, parent_id=parent, queue=queue,
                labels=labels or None, limit=args.limit, after=after))
        if args.output == "json":
            cli.emit(views)
            return 0
        print(f"{'JOB_ID':<36}  {'STATUS':<9}  {'ATTEMPT':>7}  {'QUEUE':<12}  "
              f"{'RESOURCE':<20}  RUNS")
        now = datetime.now(UTC)
        for v in views:
            actions = v["summary"]
            status = v["status"]
            if status == "pending" and v["run_at"] and v["run_at"] > now:
                status = "scheduled"
            print(harmless(f"{v['job_id']!s:<36}  {status:<9}  "
                           f"{v['attempt_count']:>3}/{v['max_attempts']:<3}  "
                           f"{v['queue'][:12]:<12}  {(v['resource'] or '-')[:20]:<20}  "
                           f"{actions}"))
        if len(views) == args.limit:
            print(f"(more: --after {views[-1]['job_id']})")
        return 0

    return cli.run_command("list", body)


def _queue(text: str) -> str:
    try:
        return queue_name(text)
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None


QUEUE_FIELDS = ("queue", "paused", "limit", "pending", "scheduled", "running")
"""The JSON object of one queue, exactly (docs/REFERENCE.md); its rate is in the text table,
the API's queues and the metrics."""


def queue_main(argv: list[str]) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence queue", description="A queue's state and settings: "
                       "pause (it keeps accepting jobs, claims none), resume, and limit "
                       "(at most N running jobs of the queue across every pod), rate (at most "
                       "N of its jobs start in any window of a period).")
        sub = p.add_subparsers(dest="verb", required=True,
                               metavar="status|pause|resume|limit|rate")
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
        rate = sub.add_parser("rate", help="at most N of the queue's jobs start per period")
        rate.add_argument("queue")
        rate.add_argument("rate", metavar="N/PERIOD|none",
                          help="e.g. 60/minute, 5/PT10S (ISO 8601), none")
        args = p.parse_args(argv)
        queue = _queue(args.queue) if args.queue is not None else None
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
            elif args.verb == "limit":
                store.queues.configure(str(queue), limit=n, set_limit=True,
                                       actor=cli.actor())
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


def _print_queues(views: list[dict[str, object]]) -> None:
    print(f"{'QUEUE':<24} {'STATE':<7} {'LIMIT':>6} {'RATE':>14} {'PENDING':>8} "
          f"{'SCHEDULED':>9} {'RUNNING':>8} {'WAITING':>8} {'OLDEST READY':>12}")
    for v in views:
        limit = "-" if v["limit"] is None else str(v["limit"])
        r = v["rate"]
        rate = "-" if not isinstance(r, dict) else \
            f"{r['started']}/{r['limit']} per {r['period_seconds']:g}s"
        age = float(str(v["oldest_ready_age_seconds"]))
        print(f"{v['queue']!s:<24} {'paused' if v['paused'] else 'active':<7} {limit:>6} "
              f"{rate:>14} {v['pending']:>8} {v['scheduled']:>9} {v['running']:>8} "
              f"{v['waiting']:>8} {age:>11.0f}s")


def info_main(argv: list[str]) -> int:
    def body() -> int:
        cli.Parser(prog="jobfence info", description="Which installation this is: its "
                   "schema, identity and schema version.").parse_args(argv)
        settings = cli.setup("info")
        with cli.open_store(settings, "info") as store:
            identity = store.control.identity(settings.installation)
            state = store.control.drain_status()
            version = store.control.schema_version()
        cli.emit({"schema": settings.schema_name, "installation": identity.installation,
                  "identified_at": identity.identified_at, "schema_version": version,
                  "draining": state.draining})
        return 0

    return cli.run_command("info", body)


def drain_main(argv: list[str]) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence drain", description="Quiesce: refuse new work, let "
                       "running jobs finish.")
        p.add_argument("mode", choices=["on", "off", "status"])
        p.add_argument("--reason")
        args = p.parse_args(argv)
        settings = cli.setup("drain")
        with cli.open_store(settings, "drain") as store:
            if args.mode != "status":
                store.control.set_drain(on=args.mode == "on", reason=args.reason,
                                        actor=cli.actor())
            state = store.control.drain_status()
            running = store.control.running_count()
            scaler = store.queues.pending_total()
            identity = store.control.identity(settings.installation)
        cli.emit({"installation": identity.installation, "draining": state.draining,
                  "since": state.drain_changed_at, "reason": state.drain_reason,
                  "running": running, "scaler_value": scaler})
        return 0

    return cli.run_command("drain", body)


def wait_main(argv: list[str]) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence wait", description="Block until a job is terminal: "
                       "exit 0 succeeded, 1 failed or cancelled, 7 timed out. The database "
                       "tells the moment it ends (LISTEN/NOTIFY); --interval is how often "
                       "to look anyway.")
        p.add_argument("job_id")
        p.add_argument("--timeout", type=float, metavar="SECONDS")
        p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                       help="polling fallback (default 2)")
        args = p.parse_args(argv)
        job_id = cli.job_id(args.job_id)
        if args.timeout is not None and not 0 <= args.timeout <= MAX_WAIT_SECONDS:
            raise InvalidSpec(f"--timeout must be between 0 and {MAX_WAIT_SECONDS:g} seconds")
        if not 0.01 <= args.interval <= 3600:
            raise InvalidSpec("--interval must be between 0.01 and 3600 seconds")
        settings = cli.setup("wait")
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        tty = sys.stdout.isatty()
        # Behind a transaction pooler a LISTEN would be heard on a server connection this
        # session no longer holds: poll at --interval instead.
        listening = settings.database_pooler != "transaction"
        with cli.open_store(settings, "wait") as store:
            if listening:
                db.listen(store.conn, store.jobs.watch(job_id))  # before the first look
            try:
                row = _wait(store, job_id, deadline, args.interval, tty=tty,
                            listening=listening)
            finally:
                if listening:
                    with contextlib.suppress(JobfenceError):
                        store.jobs.unwatch(job_id)
        if row is None:
            if tty:
                sys.stdout.write("\n")
            raise WaitTimeout(f"job {job_id} did not finish within {args.timeout:g}s")
        if tty:
            sys.stdout.write("\n")
        cli.emit({"job_id": job_id, "status": row.status, "error": row.error})
        return int(ExitCode.OK if row.status == "succeeded" else ExitCode.FAILED)

    return cli.run_command("wait", body)


def _wait(store: Store, job_id: UUID, deadline: float | None, interval: float,
          *, tty: bool, listening: bool) -> JobRow | None:
    """The job once terminal, or None at the deadline. Looks when notified (if
    ``listening``), and every ``interval`` anyway."""
    while True:
        row = store.jobs.get(job_id)
        if row is None:
            raise JobNotFound(job_id)
        if tty:
            _progress(store, row)
        if row.terminal:
            return row
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        pause = interval if left is None else min(interval, left)
        if listening:
            db.notified(store.conn, pause)
        else:
            time.sleep(pause)


def _progress(store: Store, row: JobRow) -> None:
    """A one-line progress bar: children done / total for a parent, actions otherwise."""
    if row.is_parent:
        counts = store.jobs.children_counts(row.job_id)
        total = sum(counts.values())
        done = sum(n for s, n in counts.items() if s in TERMINAL)
        label = "children"
    else:
        views = job_views(store, [row])[0]["actions"]
        total = len(views)
        done = sum(1 for a in views if a["status"] in ("succeeded", "failed", "skipped"))
        label = "actions"
    width = 30
    filled = int(width * done / total) if total else width
    bar = "#" * filled + "-" * (width - filled)
    sys.stdout.write(f"\r[{bar}] {done}/{total} {label}  {row.status:<9}")
    sys.stdout.flush()
