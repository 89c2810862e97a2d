"""worker: claim jobs of one queue and run each one's actions in order under lease and
heartbeat, recording each action's result under the attempt's fence and writing the
terminal state — fenced. Exit 0 when every claimed job succeeded (or there was nothing to
claim), 1 otherwise: a failed action, a lost fence, or SIGTERM.

A pool of one job per pod (KEDA starts a pod per unit of ready work) runs one job and
exits. A draining pool keeps claiming — ``--max-jobs N``, ``--max-seconds S`` — until
nothing is ready, N jobs were claimed or S seconds passed; ``--concurrency C`` runs up to C
jobs at once, each with its own claim, fence, lease and child processes. No claim is made
after SIGTERM, and SIGTERM gives back every job in hand within the same bound as one. The
worker itself is the wing ``jobfence.worker``.
"""

from __future__ import annotations

import sys

from jobfence import cli
from jobfence.errors import InvalidSpec
from jobfence.limits import queue_name
from jobfence.worker.loop import Worker
from jobfence.worker.proctree import become_subreaper
from jobfence.worker.sandbox import protect_worker


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence worker", description=__doc__)
        p.add_argument("--queue", metavar="Q",
                       help="the queue to serve (default: JOBFENCE_QUEUE, else default)")
        p.add_argument("--max-jobs", type=int, default=1, metavar="N",
                       help="jobs to claim before exiting (default 1, as a pod of a "
                            "one-job-per-pod pool does)")
        p.add_argument("--max-seconds", type=float, metavar="S",
                       help="claim no job after this many seconds (a draining pool's "
                            "budget; the jobs in hand finish)")
        p.add_argument("--concurrency", type=int, metavar="C",
                       help="jobs to run at once, each with its own claim, fence and lease "
                            "(default: JOBFENCE_WORKER_CONCURRENCY, else 1)")
        p.add_argument("--idle-seconds", type=float, default=0.0, metavar="S",
                       help="when nothing is ready, keep looking this long before exiting "
                            "(default 0: exit at once)")
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        if not 1 <= args.max_jobs <= 10_000_000:
            raise InvalidSpec("--max-jobs must be between 1 and 10000000")
        if args.max_seconds is not None and not 0 < args.max_seconds <= 7 * 86_400:
            raise InvalidSpec("--max-seconds must be more than 0 and at most 604800 (7 days)")
        if args.concurrency is not None and not 1 <= args.concurrency <= 1000:
            raise InvalidSpec("--concurrency must be between 1 and 1000")
        if not 0 <= args.idle_seconds <= 86_400:
            raise InvalidSpec("--idle-seconds must be between 0 and 86400")
        queue = None
        if args.queue is not None:
            try:
                queue = queue_name(args.queue)
            except ValueError as exc:
                raise InvalidSpec(f"--queue: {exc}") from None
        settings = cli.setup("worker")
        become_subreaper()  # this process runs nothing but jobs
        protect_worker()  # its environment holds the keys: closed to its jobs' code
        worker = Worker(settings, queue, args.concurrency)
        report = worker.run(args.max_jobs, args.max_seconds, args.idle_seconds)
        cli.emit(report)
        return 0 if report.ok else 1

    return cli.run_command("worker", body)


if __name__ == "__main__":
    sys.exit(main())
