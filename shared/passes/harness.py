"""The shape every periodic function shares: ``run_once(settings, deps) -> Report`` does one
pass; ``run_pass`` wraps it into a CLI ``main()`` that takes the function's lease (a second
concurrent run skips and exits 0), records the run (trigger, status, counts, duration) in
the database, folds the job metrics (``jobfence.store.job_metrics``), pushes its metrics
when a Pushgateway is set, logs, prints the report as one
JSON object, and returns the exit code.

One run at a time holds through any pooler: the lease is a row (``function_leases``), taken
when free or run out, renewed every third of ``JOBFENCE_FUNCTION_LEASE_SECONDS`` by a
keeper thread on a connection of its own, deleted when the run ends. A killed run frees its
function once its lease runs out; the next run records it as interrupted.

A pass stops cleanly: SIGTERM (a CronJob pod deleted or evicted) or a lost lease sets the
pass's stop signal and cancels the statement in flight (its transaction rolls back whole);
the pass stops at its next batch boundary (``Deps.checkpoint``), records the run as
interrupted and exits 1.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any, NamedTuple, Protocol
from uuid import UUID, uuid4

from jobfence import cli, db, metrics
from jobfence.adapters import open_cluster, open_object_store
from jobfence.cluster import Cluster
from jobfence.errors import JobfenceError, PassInterrupted
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore
from jobfence.settings import Settings
from jobfence.store import Store
from jobfence.store.types import Identity


class Report(Protocol):
    """A frozen dataclass of counts whose first field is ``function``."""

    @property
    def function(self) -> str: ...


class PodSnapshot(NamedTuple):
    """A pass's listing of the worker pods: when it began, how many pods, in how many
    pages."""

    listed_at: datetime
    pods: int
    pages: int


@dataclass
class Deps:
    """What a pass talks to. Adapters for the cluster and the object store are built on
    first use, so a pass that needs neither never imports their clients; tests pass fakes."""

    store: Store
    settings: Settings
    object_store: ObjectStore | None = None
    cluster_port: Cluster | None = None
    now: datetime | None = None
    """The pass's notion of now; None means the database's clock (production). Tests inject
    a time here so that TTLs, timeouts and expiries are tested without sleeping."""
    identity: Identity | None = None
    pass_id: UUID = field(default_factory=uuid4)
    """This run's id: the holder of its function's lease, the key of its pod snapshot."""
    stop: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    @contextlib.contextmanager
    def pod_snapshot(self, cluster: Cluster) -> Iterator[PodSnapshot]:
        """List the worker pods, page by page, into this pass's snapshot in the database
        (the comparisons with the claims run there), and delete it when the block ends.
        Raises ClusterError, leaving nothing changed, if the listing cannot be completed."""
        pods = self.store.pods
        listed_at = pods.snapshot_begin(self.pass_id, self.now)
        try:
            listed = pages = 0
            for page in cluster.worker_pod_pages():
                self.checkpoint()
                pods.snapshot_add([p.row() for p in page])
                listed += len(page)
                pages += 1
            yield PodSnapshot(listed_at, listed, pages)
        finally:
            with contextlib.suppress(JobfenceError):  # else a later pass deletes it
                pods.snapshot_end()

    def checkpoint(self) -> None:
        """Between two batches: raise PassInterrupted once the pass has been asked to stop."""
        if self.stop.is_set():
            raise PassInterrupted(f"pass interrupted: {self.stop_reason}")

    @property
    def installation(self) -> str:
        """This installation's identity, from its database (checked against
        JOBFENCE_INSTALLATION when the deployment sets it)."""
        if self.identity is None:
            self.identity = self.store.control.identity(self.settings.installation)
        assert self.identity.installation is not None
        return self.identity.installation

    @property
    def identified_at(self) -> datetime:
        """Since when the installation has had its identity: jobs made before may own
        objects under the prefix releases before it used."""
        _ = self.installation
        assert self.identity is not None and self.identity.identified_at is not None
        return self.identity.identified_at

    @property
    def cluster(self) -> Cluster | None:
        """The cluster adapter for JOBFENCE_CLUSTER, seeing only this installation's worker
        pods (None when it is ``none``)."""
        if self.cluster_port is None:
            self.cluster_port = open_cluster(self.settings, self.installation)
        return self.cluster_port

    @property
    def objects(self) -> ObjectStore:
        if self.object_store is None:
            self.object_store = open_object_store(self.settings)
        return self.object_store


RunOnce = Callable[[Settings, Deps], Report]


def detect_trigger(settings: Settings, now: datetime | None = None) -> str:
    """``scheduled`` or ``manual`` (see ``Settings.trigger``). Uncertain: scheduled."""
    if settings.trigger != "auto":
        return settings.trigger
    if settings.triggered_by:
        return "manual"
    if settings.job_name:
        return "scheduled" if scheduled_job_name(settings.job_name, now) else "manual"
    return "manual" if not os.environ.get("POD_NAME") and sys.stdin.isatty() else "scheduled"


SCHEDULED_JOB_NAME = re.compile(r".+-([0-9]{1,10})")
SCHEDULED_WINDOW = timedelta(days=1)
"""How far from now a tick's scheduled time may be for a Job named after it: a run starts
within the CronJob's startingDeadlineSeconds and retries within its activeDeadlineSeconds."""


def scheduled_job_name(name: str, now: datetime | None = None) -> bool:
    """Whether ``name`` is what the CronJob controller calls the Job of a tick:
    ``<cronjob>-<the scheduled time in minutes since 1970>``, a time near now."""
    match = SCHEDULED_JOB_NAME.fullmatch(name)
    if not match:
        return False
    now = now or datetime.now(UTC)
    tick = datetime.fromtimestamp(int(match.group(1)) * 60, UTC)
    return now - SCHEDULED_WINDOW <= tick <= now + timedelta(minutes=5)


def counts_of(report: Report) -> dict[str, Any]:
    data = asdict(report)  # type: ignore[call-overload]
    return {k: v for k, v in data.items() if k != "function"}


def snapshot(default: int | float = 0) -> Any:
    """A report field that says what the pass saw at that moment (pods listed, orphan
    suspects...), not something it did: the metrics show its last value, never a sum."""
    return field(default=default, metadata={"snapshot": True})


def snapshots_of(report: Report) -> set[str]:
    """The names of a report's snapshot fields."""
    return {f.name for f in fields(report) if f.metadata.get("snapshot")}  # type: ignore[arg-type]


class LeaseKeeper:
    """Renews the run's lease every third of it, on a connection of its own, until the run
    ends. Stops the pass when the lease is lost (another run took it over after it ran out)
    or cannot be renewed before it runs out by this process's clock."""

    def __init__(self, settings: Settings, function: str, deps: Deps) -> None:
        self.settings, self.function, self.deps = settings, function, deps
        self.seconds = settings.function_lease_seconds
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)
        self._conn: db.Connection | None = None

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=self.settings.connect_timeout_seconds + 5)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()

    def _renew(self) -> bool:
        if self._conn is None or db.stale(self._conn):
            self._conn = db.connect(self.settings.database_url,
                                    pooler=self.settings.database_pooler,
                                    application_name=f"jobfence-{self.function}-lease",
                                    connect_timeout=self.settings.connect_timeout_seconds)
        with db.deadline(self._conn, max(1.0, self.seconds / 6)):
            return Store(self._conn, self.settings.schema_name).runs.lease_renew(
                function=self.function, holder=self.deps.pass_id, lease_seconds=self.seconds)

    def _run(self) -> None:
        log = get_logger(f"jobfence.{self.function}")
        held_until = time.monotonic() + self.seconds
        while not self._done.wait(self.seconds / 3):
            try:
                if not self._renew():
                    log.error("lease_lost", message="another run took over this function")
                    self.deps.request_stop("its lease was taken over by another run")
                    return
                held_until = time.monotonic() + self.seconds
            except JobfenceError as exc:
                log.warning("lease_renewal_failed", error=str(exc))
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None
                if time.monotonic() > held_until - self.seconds / 6:
                    self.deps.request_stop("its lease could not be renewed")
                    return


@contextlib.contextmanager
def stop_on_sigterm(deps: Deps) -> Iterator[None]:
    """While the pass runs, SIGTERM (and SIGINT) stop it: the stop signal is set and the
    statement in flight cancelled, from a thread (a signal handler must not block)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        deps.request_stop(signal.Signals(signum).name)
        threading.Thread(target=db.cancel_quietly, args=(deps.store.conn,),
                         daemon=True).start()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_pass(name: str, argv: list[str] | None, run_once: RunOnce, description: str) -> int:
    log = get_logger(f"jobfence.{name}")

    def body() -> int:
        p = cli.Parser(prog=f"jobfence {name}", description=description)
        p.add_argument("--batch-size", type=int, metavar="N", help="rows per batch")
        args = p.parse_args(argv)
        settings = cli.setup(name, batch_size=args.batch_size)
        with cli.open_store(settings, name) as store:
            deps = Deps(store, settings)
            _ = deps.installation  # a pass of another installation stops here (exit 2)
            trigger = detect_trigger(settings)
            run_id = store.runs.run_started(function=name, trigger=trigger,
                                            holder=deps.pass_id,
                                            lease_seconds=settings.function_lease_seconds,
                                            triggered_by=settings.triggered_by,
                                            reason=settings.trigger_reason)
            if run_id is None:
                log.info("pass_skipped", reason="another run holds the lease", trigger=trigger)
                cli.emit({"function": name, "skipped": True})
                metrics.push(settings, store, name)
                return 0
            started = time.monotonic()
            log.info("pass_started", trigger=trigger)
            try:
                with LeaseKeeper(settings, name, deps), stop_on_sigterm(deps):
                    try:
                        report = run_once(settings, deps)
                        deps.checkpoint()  # stopped during the last batch: not a success
                    except JobfenceError as exc:
                        if deps.stop.is_set():  # the cancelled statement, or the checkpoint
                            raise PassInterrupted(
                                f"pass interrupted: {deps.stop_reason}") from exc
                        raise
            except BaseException as exc:
                interrupted = isinstance(exc, PassInterrupted)
                message = str(exc) if isinstance(exc, JobfenceError) else repr(exc)
                (log.warning if interrupted else log.error)(
                    "pass_interrupted" if interrupted else "pass_failed", error=message)
                with contextlib.suppress(Exception):  # the database may be what failed
                    store.runs.run_finished(
                        run_id=run_id, function=name, trigger=trigger,
                        status="interrupted" if interrupted else "failed", counts={},
                        error=message, duration_seconds=time.monotonic() - started)
                    store.runs.lease_release(function=name, holder=deps.pass_id)
                    metrics.push(settings, store, name)
                raise
            # Every pass also folds the job and action metrics' deltas into their totals (any
            # of the periodic functions will do: a fold is cheap, exact, safe to run at once).
            store.job_metrics.fold()
            store.action_metrics.fold()
            counts = counts_of(report)
            duration = round(time.monotonic() - started, 3)
            store.runs.run_finished(run_id=run_id, function=name, trigger=trigger,
                                    status="succeeded", counts=counts,
                                    duration_seconds=duration, gauges=snapshots_of(report))
            store.runs.lease_release(function=name, holder=deps.pass_id)
            log.info("pass_finished", duration_seconds=duration, **counts)
            cli.emit({"function": name, **counts, "duration_seconds": duration})
            metrics.push(settings, store, name)
        return 0

    return cli.run_command(name, body)
