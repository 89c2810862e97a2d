"""worker: claim jobs of one queue and run each one's actions in order under lease and
heartbeat, recording each action's result under the attempt's fence and writing the
terminal state — fenced. Exit 0 when every claimed job succeeded (or there was nothing to
claim), 1 otherwise: a failed action, a lost fence, or SIGTERM.

A pool of one job per pod (KEDA starts a pod per unit of ready work) runs one job and
exits. A draining pool keeps claiming — ``--max-jobs N``, ``--max-seconds S`` — until
nothing is ready, N jobs were claimed or S seconds passed; each job still has its own
fence and lease, no claim is made after SIGTERM, and SIGTERM gives back the job in hand
within the same bound as a one-job worker. The next claim rides on the previous job's
terminal write: one round trip and one commit per job.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial

from jobfence import cli
from jobfence.errors import InvalidSpec
from jobfence.execution import AttemptRunner, Outcome
from jobfence.logs import get_logger
from jobfence.proctree import become_subreaper
from jobfence.sandbox import protect_worker
from jobfence.settings import Settings
from jobfence.shutdown import on_termination
from jobfence.spec import queue_name
from jobfence.store import Claim

log = get_logger("jobfence.worker")

# After SIGTERM the watcher has released the job; the main thread gets this long to come
# back from the action before the process exits regardless.
EXIT_GRACE_SECONDS = 2.0


@dataclass
class Report:
    function: str = "worker"
    worker_id: str = ""
    queue: str = "default"
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    terminated: bool = False
    stopped_by: str = ""
    """Why the worker stopped claiming: nothing_ready, max_jobs, max_seconds, sigterm, or
    sidecar_lost (its command sidecar went away: no command can start here any more)."""
    jobs: list[dict[str, str]] = field(default_factory=list)

    def count(self, job_id: object, outcome: Outcome) -> None:
        self.jobs.append({"job_id": str(job_id), "outcome": outcome.value})
        if outcome is Outcome.SUCCEEDED:
            self.succeeded += 1
        elif outcome is Outcome.RETRY:
            self.retried += 1
        elif outcome is Outcome.FAILED:
            self.failed += 1
        elif outcome is Outcome.LOST:
            self.lost += 1
        else:
            self.terminated = True

    @property
    def ok(self) -> bool:
        return (self.succeeded == self.claimed and not self.terminated
                and self.stopped_by != "sidecar_lost")


class Worker(AttemptRunner):
    def __init__(self, settings: Settings, queue: str | None = None) -> None:
        super().__init__(settings, queue or settings.queue)
        self.report = Report(worker_id=settings.worker, queue=self.queue)
        self._main_done = threading.Event()

    def run(self, max_jobs: int, max_seconds: float | None = None) -> Report:
        deadline = None if max_seconds is None else time.monotonic() + max_seconds

        def time_left() -> bool:
            return deadline is None or time.monotonic() < deadline

        def another(claimed: int) -> bool:
            """Asked at a job's terminal write: whether to claim the next one with it."""
            return claimed < max_jobs and time_left() and self.sandbox.ready()

        with on_termination(self._on_signal) as terminated:
            try:
                pending: Claim | None = None
                for n in range(max_jobs):
                    if pending is None:
                        if terminated.is_set():
                            self.report.stopped_by = "sigterm"
                            break
                        if not time_left():
                            self.report.stopped_by = "max_seconds"
                            break
                        if not self.sandbox.ready():
                            self.report.stopped_by = "sidecar_lost"
                            break
                        claims = self.store.attempts.claim(
                            worker_id=self.settings.worker, queue=self.queue,
                            lease_seconds=self.settings.lease_seconds)
                        if not claims:
                            log.info("nothing_to_claim", queue=self.queue)
                            self.report.stopped_by = "nothing_ready"
                            break
                        pending = claims[0]
                    # A claim made together with the last terminal write is run even after
                    # SIGTERM: run_attempt gives it straight back.
                    claim, pending = pending, None
                    self.want_next = partial(another, n + 1)
                    self.report.claimed += 1
                    self.report.count(claim.job_id, self.run_attempt(claim))
                    pending, self.next_claim = self.next_claim, None
                    if pending is None and not self.sandbox.ready():
                        self.report.stopped_by = "sidecar_lost"
                        break
                else:
                    self.report.stopped_by = "max_jobs"
            finally:
                self._main_done.set()
            if terminated.is_set():
                self.report.terminated = True
                self.report.stopped_by = "sigterm"
        self.close()
        return self.report

    def _on_signal(self, signum: int) -> None:
        """Runs on the shutdown watcher thread, while the main thread may be blocked in an
        action: fenced clean-up first, then leave."""
        log.warning("sigterm_received", signal=signum)
        guard = self.current_guard()
        if guard is not None:
            guard.release_on_sigterm()
        if not self._main_done.wait(EXIT_GRACE_SECONDS):
            log.error("exit_forced", message="the action did not stop in time")
            self.report.terminated = True
            cli.emit(self.report)
            sys.stderr.flush()
            os._exit(1)


def run_once(settings: Settings, max_jobs: int = 1, max_seconds: float | None = None,
             queue: str | None = None) -> Report:
    return Worker(settings, queue).run(max_jobs, max_seconds)


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
                            "budget; the job in hand finishes)")
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        if not 1 <= args.max_jobs <= 10_000_000:
            raise InvalidSpec("--max-jobs must be between 1 and 10000000")
        if args.max_seconds is not None and not 0 < args.max_seconds <= 7 * 86_400:
            raise InvalidSpec("--max-seconds must be more than 0 and at most 604800 (7 days)")
        queue = None
        if args.queue is not None:
            try:
                queue = queue_name(args.queue)
            except ValueError as exc:
                raise InvalidSpec(f"--queue: {exc}") from None
        settings = cli.setup("worker")
        become_subreaper()  # this process runs nothing but jobs
        protect_worker()  # its environment holds the keys: closed to its jobs' code
        report = run_once(settings, args.max_jobs, args.max_seconds, queue)
        cli.emit(report)
        return 0 if report.ok else 1

    return cli.run_command("worker", body)


if __name__ == "__main__":
    sys.exit(main())
