"""wait: block until a job is terminal — exit 0 succeeded, 1 failed or cancelled, 7 timed
out. The database tells the moment it ends (LISTEN/NOTIFY; behind a transaction pooler it
is polled instead), ``--interval`` is how often to look anyway; on a terminal, a progress
bar of its children or actions."""

from __future__ import annotations

import contextlib
import sys
import time
from uuid import UUID

from jobfence import cli, db
from jobfence.errors import ExitCode, InvalidSpec, JobfenceError, JobNotFound, WaitTimeout
from jobfence.limits import MAX_WAIT_SECONDS
from jobfence.store import TERMINAL, JobRow, Store
from jobfence.views import job_views


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence wait", description="Block until a job is terminal: "
                       "exit 0 succeeded, 1 failed or cancelled, 7 timed out. The database "
                       "tells the moment it ends (LISTEN/NOTIFY); --interval is how often "
                       "to look anyway.")
        p.add_argument("job_id")
        p.add_argument("--timeout", type=float, metavar="SECONDS")
        p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                       help="polling fallback (default 2)")
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
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
        listening = settings.can_listen
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


if __name__ == "__main__":
    sys.exit(main())
