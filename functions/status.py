"""status: one job — its state, attempts, actions (env values masked) and, with
``--events``, its audit trail; ``--reveal-env`` shows the actions' env values, recorded with
who asked and why."""

from __future__ import annotations

import sys

from jobfence import cli
from jobfence.errors import InvalidSpec, JobNotFound
from jobfence.terminal import harmless
from jobfence.views import job_views, render_text


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence status", description="Show one job.")
        p.add_argument("job_id")
        p.add_argument("-o", "--output", choices=["text", "json"], default="text")
        p.add_argument("--events", action="store_true", help="include the audit trail")
        p.add_argument("--reveal-env", action="store_true", help="show the values of the "
                       "actions' env (an operator's login; recorded with who asked and why)")
        p.add_argument("--reason", help="why the env values are needed (recorded)")
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
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


if __name__ == "__main__":
    sys.exit(main())
