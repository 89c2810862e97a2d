"""The worker's loop: claim jobs of one queue for the free slots, run each claimed job in a
slot of its own (``Execution``), count what each returns, and stop when nothing is ready,
``--max-jobs`` were claimed, ``--max-seconds`` passed, SIGTERM came, or the command sidecar
went away.

A worker runs up to ``--concurrency`` jobs at once (``JOBFENCE_WORKER_CONCURRENCY``, per
pool in the pool declaration; 1 by default: one job at a time, as a one-job-per-pod pool
runs it). Each running job keeps its own claim, ``attempt_id``, lease, run timeout, child
process tree, cancel and fenced terminal write; what they share is batched without
touching a fence (``jobfence.worker.store_link``, ``jobfence.worker.guard``). The loop
claims only for free slots, in one statement for all of them, so a claimed job never waits
behind another; a slot whose job finished takes the next job from the claim that rode on
that job's terminal write. The loop never reaches into an execution: it starts one with
its claim and reads the ``Result`` it returns.

SIGTERM gives back every job in hand within the same bound as one (the guards give them all
back in one statement), and no claim is made after it.
"""

from __future__ import annotations

import math
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field

from jobfence import cli
from jobfence.actions.installed import registry
from jobfence.adapters import open_object_store
from jobfence.errors import ConfigError, JobfenceError, StoreUnavailable
from jobfence.jobuids import users_for
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore
from jobfence.settings import Settings
from jobfence.settings.commands import command_env_refusal
from jobfence.shutdown import on_termination
from jobfence.store import Claim
from jobfence.worker.budget import Budget
from jobfence.worker.execution import Execution, Outcome, Result, Wiring
from jobfence.worker.guard_threads import Guards
from jobfence.worker.jobspace import LocalSpaces
from jobfence.worker.output import LineBudget
from jobfence.worker.proctree import kill_descendants
from jobfence.worker.sandbox import Sandbox, Spaces
from jobfence.worker.store_link import StoreLink
from jobfence.worker.wakeup import Wakeup

log = get_logger("jobfence.worker")

EXIT_GRACE_SECONDS = 2.0
"""After SIGTERM the guards have given back every job; the executions get this long to come
back from their actions before the process exits regardless."""

BUSY_POLL_SECONDS = 0.25
"""While some slots run jobs and the last claim found nothing: how often the free slots
look again (each finishing job also asks, on its terminal write, and a job found that way
wakes the loop to fill the free slots at once)."""

CLAIM_BACKOFF_SECONDS = 1.0
"""While some slots run jobs and a claim could not reach the database (an outage, a
failover): how long the free slots wait before they try again. The jobs running keep their
leases through the guards' own connection; the worker stops for the outage only once none
runs."""

IDLE_POLL_SECONDS = 0.02
"""With ``--idle-seconds``, while nothing runs: how often the worker looks for ready work.
Where it can LISTEN it is also told at once (``jobfence.worker.wakeup``)."""


@dataclass
class Report:
    function: str = "worker"
    worker_id: str = ""
    queue: str = "default"
    concurrency: int = 1
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    snoozed: int = 0
    failed: int = 0
    lost: int = 0
    given_back: int = 0
    """Jobs this worker could not run (no free uid for their command): pending again, their
    attempts not spent."""
    terminated: bool = False
    listened: bool = False
    """Whether the worker listened for ready work (it waited for some, and no transaction
    pooler stood between it and the database)."""
    stopped_by: str = ""
    """Why the worker stopped claiming: nothing_ready, max_jobs, max_seconds, sigterm,
    sidecar_lost (its command sidecar went away: no command can start here any more),
    guards_failed (a guard thread could not run: every job was given back), or no_free_uid
    (a job was given back: every uid for its command is held on this machine)."""
    jobs: list[dict[str, str]] = field(default_factory=list)

    def count(self, result: Result) -> None:
        self.jobs.append({"job_id": str(result.claim.job_id), "outcome": result.outcome.value})
        counter = COUNTERS.get(result.outcome)
        if counter is None:
            self.terminated = True
        else:
            setattr(self, counter, getattr(self, counter) + 1)

    @property
    def ok(self) -> bool:
        return (self.succeeded + self.snoozed == self.claimed and not self.terminated
                and self.stopped_by not in ("sidecar_lost", "guards_failed"))


COUNTERS = {Outcome.SUCCEEDED: "succeeded", Outcome.RETRY: "retried",
            Outcome.SNOOZED: "snoozed", Outcome.FAILED: "failed", Outcome.LOST: "lost",
            Outcome.GIVEN_BACK: "given_back"}
"""The report's counter of each outcome (any other: the worker was terminated)."""

MORE = object()
"""What a slot tells the loop when its next claim found a job while the loop thought
nothing was ready."""


def open_sandbox(settings: Settings) -> Sandbox:
    """Where this worker's jobs start their children — here, or in the command sidecar
    (``JOBFENCE_COMMAND_SOCKET``) — chosen once, here."""
    passthrough = tuple(n for n in settings.command_env.split(",") if n)
    if settings.command_env_allow_secrets and (why := command_env_refusal(
            settings.command_env)) is not None:
        log.warning("command_env_unsafe", names=list(passthrough), message=why.replace(
            "would hand", "hands").split(" (")[0] + " (JOBFENCE_COMMAND_ENV_ALLOW_SECRETS)")
    spaces: Spaces
    try:
        if settings.command_socket is not None:
            from jobfence.worker.sidecar.link import SidecarLink, SidecarSpaces

            spaces = SidecarSpaces(SidecarLink(settings.command_socket,
                                               settings.command_runner_uid))
        else:
            spaces = LocalSpaces(users_for(settings.command_user, settings.command_uids),
                                 sample_seconds=settings.usage_sample_seconds)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return Sandbox(spaces, passthrough)


def warn_durability(store_link: StoreLink) -> None:
    """Say at start when the database may lose an acknowledged commit (asynchronous
    replicas, ``synchronous_commit`` off or local): jobs may then run twice after a
    failover. Never fatal."""
    try:
        for why in store_link.read(lambda s: s.control.durability()):
            log.warning("durability_at_risk", message=why)
    except Exception as exc:
        log.debug("durability_unknown", error=str(exc))


def register_actions(store_link: StoreLink) -> None:
    """Tell the database the action names this worker may run (its registry: built-ins and
    installed plugins), so that their metrics have labels of their own; any other name
    counts as ``other``. Never fatal: a plugin that does not load fails its jobs as before,
    and metrics are not worth a worker."""
    try:
        names = list(registry())
        store_link.read(lambda s: s.action_metrics.register(names))
    except Exception as exc:
        log.warning("actions_not_registered", error=str(exc))


class Worker:
    """One worker process: its connection, its guards, its sandbox, and its slots."""

    def __init__(self, settings: Settings, queue_name: str | None = None,
                 concurrency: int | None = None) -> None:
        self.settings = settings
        self.queue = queue_name or settings.queue
        self.concurrency = concurrency or settings.worker_concurrency
        self.sandbox = open_sandbox(settings)
        store_link = StoreLink(settings, self.queue)
        # A worker of another installation stops here (exit 2), before it claims anything.
        identity = store_link.read(lambda s: s.control.identity(settings.installation))
        assert identity.installation is not None
        warn_durability(store_link)
        register_actions(store_link)
        self._objects: ObjectStore | None = None
        self.wiring = Wiring(settings=settings, store_link=store_link,
                             guards=Guards(settings, queue=self.queue),
                             sandbox=self.sandbox,
                             objects=self.objects, installation=identity.installation,
                             retry=settings.retry_policy,
                             lines=LineBudget(settings.output_lines_per_second))
        self.report = Report(worker_id=settings.worker, queue=self.queue,
                             concurrency=self.concurrency)
        self._results: queue.Queue[Result | BaseException | object] = queue.Queue()
        """A slot's last result when it is free, what crashed in it, or ``MORE``."""
        self._counting = threading.Lock()
        self._dry = threading.Event()
        """Set while the loop's last claim found fewer jobs than it asked for: the first
        slot whose next claim then finds a job tells the loop (more may be ready)."""
        self._main_done = threading.Event()
        self._wakeup: Wakeup | None = None
        self._woken = threading.Event()
        """Set while a wake-up's ``MORE`` waits in the queue: a burst of notifications
        makes one look, not one each."""

    def objects(self) -> ObjectStore:
        """The object store, built on first use: a job without S3 never imports boto3."""
        if self._objects is None:
            self._objects = open_object_store(self.settings)
        return self._objects

    def close(self) -> None:
        if self._wakeup is not None:
            self._wakeup.close()
        # No job runs any more: whatever a job left that could not be told apart dies now.
        kill_descendants(reap_children=True)
        self.wiring.guards.close()  # its threads end before the connections they use
        self.wiring.store_link.close()
        self.sandbox.spaces.close()

    # -- slots -------------------------------------------------------------------------------

    def _start(self, claim: Claim, budget: Budget) -> None:
        threading.Thread(target=self._slot, args=(claim, budget), daemon=True,
                         name=f"job-{claim.job_id}").start()

    def _slot(self, claim: Claim | None, budget: Budget) -> None:
        """Run a claimed job, then the one whose claim rode on its terminal write, and so
        on, counting each one's result; the loop hears when the slot is free (or what
        crashed), not of every job: a job costs no wake-up of the loop."""
        result: Result | None = None
        while claim is not None:
            try:
                result = Execution(claim, self.wiring, budget.next()).run()
            except BaseException as exc:
                self._results.put(exc)
                return
            if result.outcome is Outcome.GIVEN_BACK:
                budget.no_free_uid.set()
            with self._counting:
                self.report.count(result)
                if result.next_claim is not None:
                    self.report.claimed += 1
            claim = result.next_claim
            if claim is not None and self._dry.is_set():
                self._dry.clear()
                self._results.put(MORE)
        assert result is not None
        self._results.put(result)

    # -- the loop ----------------------------------------------------------------------------

    def run(self, max_jobs: int, max_seconds: float | None = None,
            idle_seconds: float = 0.0) -> Report:
        budget = Budget(max_jobs, max_seconds, self.sandbox.spaces,
                        self.wiring.guards.failed)
        if idle_seconds > 0 or (self.concurrency > 1 and max_jobs > 1):  # it will wait
            self._wakeup = Wakeup(self.settings, self.queue, self._wake)
            self.report.listened = self._wakeup.enabled
        crash: BaseException | None = None
        try:
            with on_termination(lambda signum: self._on_signal(signum, budget)) as terminated:
                try:
                    crash = self._loop(budget, idle_seconds)
                finally:
                    self._main_done.set()
                if terminated.is_set():
                    self.report.terminated = True
                    self.report.stopped_by = "sigterm"
                elif self.wiring.guards.failed.is_set():
                    self.report.terminated = True
                    self.report.stopped_by = "guards_failed"
        finally:  # also when the worker stops on a claim that failed (exit 4): what that
            self.close()  # claim may have taken is given back, or said to be left
        if crash is not None:
            raise crash
        return self.report

    def _wake(self) -> None:
        """Ready work on this queue, says the database: the loop looks now."""
        if not self._woken.is_set():
            self._woken.set()
            self._results.put(MORE)

    def _loop(self, budget: Budget, idle_seconds: float) -> BaseException | None:
        """Claim for free slots and count results until the worker stops claiming and its
        last job has ended; an execution that crashed is raised once the others ended."""
        running = 0
        dry = False  # the last claim found fewer jobs than it asked for
        looked = 0.0
        idle_until = time.monotonic() + idle_seconds
        due = math.inf  # when the next job not ready yet becomes ready (worker_next_due)
        crash: BaseException | None = None
        while True:
            now = time.monotonic()
            why = budget.why_not()
            if running == 0 and (crash is not None or why is not None
                                 or (dry and now >= idle_until)):
                self.report.stopped_by = why or "nothing_ready"
                return crash
            free = self.concurrency - running
            if free > 0 and why is None and crash is None:
                poll = BUSY_POLL_SECONDS if running else IDLE_POLL_SECONDS
                if not dry or now - looked >= poll or now >= due:
                    granted = budget.take(free)
                    try:
                        claims = self.wiring.store_link.claim(granted) if granted else []
                    except StoreUnavailable as exc:
                        budget.give(granted)
                        if not running:
                            raise  # nothing in hand: the worker stops (exit 4)
                        log.warning("claim_failed", error=str(exc),
                                    retry_in=CLAIM_BACKOFF_SECONDS)
                        looked = time.monotonic() + CLAIM_BACKOFF_SECONDS - BUSY_POLL_SECONDS
                        dry = True
                        continue
                    budget.give(granted - len(claims))
                    looked = time.monotonic()
                    if claims:
                        idle_until = looked + idle_seconds
                    elif not dry and not running:
                        log.info("nothing_to_claim", queue=self.queue)
                    dry = len(claims) < granted
                    if dry:
                        self._dry.set()
                    else:
                        self._dry.clear()
                    if dry and claims:  # work is arriving: look again as an idle worker would
                        due = looked + IDLE_POLL_SECONDS
                    else:  # none found beside running jobs: look again when the next is due
                        due = self._next_due() if dry and running else math.inf
                    for claim in claims:
                        with self._counting:
                            self.report.claimed += 1
                        self._start(claim, budget)
                    running += len(claims)
                    continue
                if running == 0:  # nothing can come back but a wake-up
                    try:
                        if self._results.get(timeout=max(0.0, looked + poll - now)) is MORE:
                            self._woken.clear()
                            dry = False
                    except queue.Empty:
                        pass
                    continue
            wait = (max(0.0, min(looked + BUSY_POLL_SECONDS, due) - now)
                    if dry and free > 0 and why is None else None)
            try:
                got = self._results.get(timeout=wait)
            except queue.Empty:
                continue
            if got is MORE:  # a slot's next claim found work, or the database said some is
                self._woken.clear()  # ready: the free slots look now
                dry = False
                continue
            running -= 1  # a slot is free
            if isinstance(got, BaseException):
                log.error("execution_crashed", error=repr(got))
                crash = crash or got

    def _next_due(self) -> float:
        """When (monotonic) the next job of the queue not ready yet becomes ready: the free
        slots of a busy worker look then, not at their next look; inf when none is
        scheduled or the database cannot say (the look finds it)."""
        try:
            seconds = self.wiring.store_link.read(lambda s: s.attempts.next_due(self.queue))
        except JobfenceError:
            return math.inf
        return math.inf if seconds is None else time.monotonic() + seconds

    def _on_signal(self, signum: int, budget: Budget) -> None:
        """Runs on the shutdown watcher thread, while executions may be blocked in their
        actions: no claim from now on, every job in hand given back, then leave."""
        log.warning("sigterm_received", signal=signum)
        budget.terminated.set()
        self.wiring.guards.give_back_all()
        if not self._main_done.wait(EXIT_GRACE_SECONDS):
            log.error("exit_forced", message="an action did not stop in time")
            self.wiring.store_link.leave()
            self.report.terminated = True
            cli.emit(self.report)
            sys.stderr.flush()
            os._exit(1)
