"""cancel: a job by its id — a parent's children with it; a running job's command is
stopped within a second, and until its worker confirms it gone the job keeps its
resource — or a selection in bulk: the filters ``list`` has, a window of creation time, a
batch per transaction, each job audited with the caller (``jobfence.bulk``). ``--dry-run``
prints what would be touched and writes nothing. Past ``--limit`` jobs a terminal asks
first; elsewhere ``--yes`` says so, or nothing is done."""

from __future__ import annotations

import sys

from jobfence import bulk, cli
from jobfence.submit import cancelled_object

WHAT = ("Cancel a job (a parent's children with it); a running job's command is stopped "
        "within a second, and until its worker confirms it gone the job keeps its resource.")


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = bulk.parser("cancel", WHAT).parse_args(
            list(sys.argv[1:] if argv is None else argv))
        if args.job_id is None:
            return bulk.act_on_selection("cancel", args)
        job_id = bulk.one_job(args)
        settings = cli.setup("cancel")
        with cli.open_store(settings, "cancel") as store:
            done = store.jobs.cancel(job_id=job_id,
                                     reason=args.reason or "cancelled by operator")
        cli.emit(cancelled_object(job_id, done))
        return 0

    return cli.run_command("cancel", body)


if __name__ == "__main__":
    sys.exit(main())
