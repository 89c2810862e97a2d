"""list: jobs, newest first, filtered by status, resource, parent, queue and labels, a page
at a time (``--after`` the last job id of the previous page)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from jobfence import cli
from jobfence.errors import InvalidSpec
from jobfence.store import ACTIVE, TERMINAL
from jobfence.terminal import harmless
from jobfence.views import job_views


def main(argv: list[str] | None = None) -> int:
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
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        if not 1 <= args.limit <= 10_000:
            raise InvalidSpec("--limit must be between 1 and 10000 (page on with --after)")
        parent = cli.job_id(args.parent) if args.parent else None
        after = cli.job_id(args.after) if args.after else None
        queue = cli.queue_of(args.queue) if args.queue else None
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


if __name__ == "__main__":
    sys.exit(main())
