"""cancel and retry: one job by its id, or a selection in bulk — the filters ``list`` has,
a window of creation time — a batch per transaction, each job audited with the caller
(``jobfence.bulk``). ``--dry-run`` prints what would be touched and writes nothing. Past
``--limit`` jobs a terminal asks first; elsewhere ``--yes`` says so, or nothing is done."""

from __future__ import annotations

import sys

from jobfence import bulk, cli
from jobfence.errors import ExitCode, InvalidSpec
from jobfence.spec import queue_name
from jobfence.store import ACTIVE
from jobfence.store.values import Selected
from jobfence.submit import cancelled_object

DEFAULT_LIMIT = 1000



def parser(verb: str) -> cli.Parser:
    what = ("Cancel a job (a parent's children with it); a running job's command is "
            "stopped within a second, and until its worker confirms it gone the job keeps "
            "its resource." if verb == "cancel" else
            "Run a failed or cancelled job again: pending at once, with a new attempt "
            "budget (audited).")
    p = cli.Parser(prog=f"jobfence {verb}", description=f"{what} With filters instead of "
                   "a job id: every job they select, in batches, each audited with who "
                   "asked.")
    p.add_argument("job_id", nargs="?", metavar="JOB_ID")
    p.add_argument("--reason", help="why (recorded in each job's audit trail)")
    p.add_argument("--status", action="append", default=[],
                   choices=[*(ACTIVE if verb == "cancel" else ()),
                            *(("failed", "cancelled") if verb == "retry" else ())],
                   help="jobs in this status (repeat for several)")
    p.add_argument("--queue", metavar="Q")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--resource", metavar="KEY")
    p.add_argument("--parent", metavar="JOB_ID")
    p.add_argument("--before", metavar="TIME", help="made before this RFC 3339 time, or "
                   "this ISO 8601 duration ago (PT12H)")
    p.add_argument("--after", metavar="TIME", help="made at or after this time")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                   help=f"act on at most this many without asking (default {DEFAULT_LIMIT})")
    p.add_argument("--dry-run", action="store_true", help="print what would be touched")
    p.add_argument("--yes", "-y", action="store_true", help="act past --limit without asking")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    return p


def selection_of(args: object, verb: str) -> bulk.Selection:
    a = vars(args)
    queue = None
    if a["queue"] is not None:
        try:
            queue = queue_name(a["queue"])
        except ValueError as exc:
            raise InvalidSpec(str(exc)) from None
    sel = bulk.Selection(
        statuses=tuple(dict.fromkeys(a["status"])), queue=queue, resource=a["resource"],
        parent_id=cli.job_id(a["parent"]) if a["parent"] else None,
        labels=cli.labels_of(a["label"]),
        created_before=bulk.parse_time(a["before"], "--before") if a["before"] else None,
        created_after=bulk.parse_time(a["after"], "--after") if a["after"] else None)
    sel.check(verb)
    if not 1 <= a["limit"] <= bulk.MAX_LIMIT:
        raise InvalidSpec(f"--limit must be between 1 and {bulk.MAX_LIMIT}")
    return sel


def _confirmed(verb: str, matched: int, limit: int) -> bool:
    """Ask on the terminal whether to act on ``matched`` jobs, past ``limit``."""
    sys.stderr.write(f"{matched} jobs match, more than --limit {limit}. "
                     f"{verb.capitalize()} all {matched}? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _one(verb: str, args: object) -> int:
    a = vars(args)
    given = [k for k in ("status", "queue", "label", "resource", "parent", "before", "after")
             if a[k]] + [k for k in ("dry_run", "yes") if a[k]]
    if given:
        raise InvalidSpec(f"give a job id or filters (--{given[0].replace('_', '-')}), "
                          "not both")
    job_id = cli.job_id(a["job_id"])
    settings = cli.setup(verb)
    with cli.open_store(settings, verb) as store:
        if verb == "cancel":
            done = store.jobs.cancel(job_id=job_id, reason=a["reason"] or
                                     "cancelled by operator")
            out = cancelled_object(job_id, done)
        else:
            t = store.jobs.retry(job_id=job_id, reason=a["reason"] or "retried by operator")
            out = {"job_id": job_id, "status": t.status}
    cli.emit(out)
    return 0


def _bulk(verb: str, args: object) -> int:
    a = vars(args)
    sel = selection_of(args, verb)
    settings = cli.setup(verb)
    text = a["output"] == "text"

    def show(page: list[Selected]) -> None:
        if text and a["dry_run"]:
            sys.stdout.write("".join(f"{p.job_id}  {p.status:<9}  {p.queue}\n" for p in page))

    with cli.open_store(settings, verb) as store:
        ceiling = bulk.ceiling_now(store)
        limit = a["limit"]
        if a["dry_run"]:
            limit = bulk.MAX_LIMIT
        else:
            matched = bulk.count(store, sel, ceiling=ceiling, cap=bulk.MAX_LIMIT)
            if matched > limit and not a["yes"]:
                if not (sys.stdin.isatty() and sys.stderr.isatty()):
                    raise InvalidSpec(f"{matched} jobs match, more than --limit {limit}: "
                                      f"pass --yes to {verb} all of them, raise --limit, or "
                                      "narrow the selection (nothing was written)")
                if not _confirmed(verb, matched, limit):
                    cli.error("nothing was done")
                    return int(ExitCode.FAILED)
            limit = max(1, matched)
        out = bulk.act(store, verb, sel, reason=bulk.said_by(verb, cli.actor(), a["reason"]),
                       limit=limit, batch=settings.batch_size, dry_run=a["dry_run"],
                       ceiling=ceiling, on_page=show)
    if not text:
        cli.emit(out.as_json())
    elif a["dry_run"]:
        print(f"would {verb} {len(out.job_ids)} jobs (dry run: nothing was written)")
    else:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(out.refused.items()))
        extra = (f", {out.children_cancelled} children with them"
                 if out.children_cancelled else "")
        print(f"{bulk.DONE[verb]} {out.done} of {out.matched} jobs{extra}"
              + (f" (refused: {refused})" if refused else "")
              + f" in {out.batches} batches")
    return 0


def _main(verb: str, argv: list[str] | None) -> int:
    def body() -> int:
        args = parser(verb).parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.job_id is not None:
            return _one(verb, args)
        return _bulk(verb, args)

    return cli.run_command(verb, body)


def cancel_main(argv: list[str] | None = None) -> int:
    return _main("cancel", argv)


def retry_main(argv: list[str] | None = None) -> int:
    return _main("retry", argv)

