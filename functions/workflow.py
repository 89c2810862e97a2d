"""workflow: a workflow's state and its steps (status), the workflows newest first (list),
and cancel (every unfinished step, a running one's command stopped through the cancel path)
or retry (the failed and the never-run steps, the succeeded ones kept). A workflow is
submitted by ``jobfence enqueue`` given its spec file (docs/REFERENCE.md, "Workflows"); each
change is audited with who made it."""

from __future__ import annotations

import sys
from typing import Any
from uuid import UUID

from jobfence import cli, workflows
from jobfence.errors import InvalidSpec


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence workflow", description=__doc__)
        sub = p.add_subparsers(dest="verb", required=True, metavar="status|list|cancel|retry")
        status = sub.add_parser("status", help="a workflow's state and each step's")
        status.add_argument("workflow_id", metavar="ID")
        status.add_argument("-o", "--output", choices=["text", "json"], default="text")
        listing = sub.add_parser("list", help="workflows, newest first")
        listing.add_argument("--name")
        listing.add_argument("--limit", type=int, default=50)
        listing.add_argument("--after", metavar="ID", help="only older ones (the next page)")
        listing.add_argument("-o", "--output", choices=["text", "json"], default="text")
        for verb, what in (("cancel", "cancel every unfinished step"),
                           ("retry", "run the failed and never-run steps again")):
            v = sub.add_parser(verb, help=what)
            v.add_argument("workflow_id", metavar="ID")
            v.add_argument("--reason")
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        given = args.after if args.verb == "list" else args.workflow_id
        workflow_id = _id(given) if given is not None else None
        if args.verb == "list" and not 1 <= args.limit <= 500:
            raise InvalidSpec(f"--limit {args.limit}: give 1 to 500")
        settings = cli.setup("workflow")
        with cli.open_store(settings, "workflow") as store:
            if args.verb == "list":
                rows = store.workflows.page(name=args.name, limit=args.limit,
                                            after=workflow_id)
                views = workflows.views(store, rows)
                if args.output == "json":
                    cli.emit(views)
                else:
                    _print_list(views)
                return 0
            assert workflow_id is not None
            reason = getattr(args, "reason", None) or "by operator"
            if args.verb == "cancel":
                workflows.cancel(store, workflow_id, actor=cli.actor(),
                                 reason=f"workflow cancelled: {reason}")
            elif args.verb == "retry":
                workflows.retry(store, workflow_id, actor=cli.actor(),
                                reason=f"workflow retried: {reason}")
            view = workflows.workflow_view(*workflows.get(store, workflow_id))
        if args.verb == "status" and args.output == "text":
            _print_one(view)
        else:
            cli.emit(view)
        return 0

    return cli.run_command("workflow", body)


def _id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise InvalidSpec(f"{text[:60]!r} is not a workflow id") from None


def _state(view: dict[str, Any]) -> str:
    if view["status"] == "failed" and view["failed_step"]:
        return f"failed at step {view['failed_step']}"
    return str(view["status"])


def _print_one(view: dict[str, Any]) -> None:
    print(f"workflow {view['workflow_id']}  {view['workflow']}  {_state(view).upper()}  "
          f"({view['steps_succeeded']}/{view['steps_total']} steps succeeded)")
    for k in ("created_at", "started_at", "finished_at", "cancelled_at", "created_by"):
        if view[k] is not None:
            print(f"  {k.replace('_', ' ')}: {view[k]}")
    print(f"  {'STEP':<24} {'STATUS':<10} {'JOB':<36} {'FILES IN':>8}  AFTER")
    for name, s in view["steps"].items():
        after = ", ".join(s["after"] + s["after_jobs"]) or "-"
        fan = " (fan-out)" if s["fan_out"] else ""
        handed = "-" if not s["inputs_from"] else (
            "later" if s["inputs_handed"] is None else str(s["inputs_handed"]))
        print(f"  {name + fan:<24} {s['status']:<10} {s['job_id']:<36} {handed:>8}  {after}")
        if s["status"] in ("failed", "cancelled") and s["error"]:
            print(f"  {'':<24} {str(s['error'])[:200]}")


def _print_list(views: list[dict[str, Any]]) -> None:
    print(f"{'WORKFLOW ID':<36}  {'NAME':<24} {'STATUS':<24} {'STEPS':>9}  CREATED")
    for v in views:
        steps = f"{v['steps_succeeded']}/{v['steps_total']}"
        print(f"{v['workflow_id']:<36}  {v['workflow']:<24} {_state(v):<24} {steps:>9}  "
              f"{v['created_at']:%Y-%m-%d %H:%M:%S}")


if __name__ == "__main__":
    sys.exit(main())
