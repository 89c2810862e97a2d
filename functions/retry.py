"""retry: run a failed or cancelled job again — pending at once, with a new attempt budget
(audited) — by its id, or a selection in bulk: the filters ``list`` has, a window of
creation time, a batch per transaction, each job audited with the caller
(``jobfence.bulk``). ``--dry-run`` prints what would be touched and writes nothing. Past
``--limit`` jobs a terminal asks first; elsewhere ``--yes`` says so, or nothing is done."""

from __future__ import annotations

import sys

from jobfence import bulk, cli

WHAT = ("Run a failed or cancelled job again: pending at once, with a new attempt budget "
        "(audited).")


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = bulk.parser("retry", WHAT).parse_args(
            list(sys.argv[1:] if argv is None else argv))
        if args.job_id is None:
            return bulk.act_on_selection("retry", args)
        job_id = bulk.one_job(args)
        settings = cli.setup("retry")
        with cli.open_store(settings, "retry") as store:
            t = store.jobs.retry(job_id=job_id, reason=args.reason or "retried by operator")
        cli.emit({"job_id": job_id, "status": t.status})
        return 0

    return cli.run_command("retry", body)


if __name__ == "__main__":
    sys.exit(main())
