"""The shape every periodic function shares: ``run_once(settings, deps) -> Report`` does one
pass; ``run_pass`` wraps it into a CLI ``main()`` that takes the function's advisory lock
(a second concurrent run skips and exits 0), records the run (trigger, status, counts,
duration) in the database, pushes its metrics when a Pushgateway is set, logs, prints the
report as one JSON object, and returns the exit code.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol

from jobfence import cli, metrics
from jobfence.cluster import Cluster
from jobfence.errors import ClusterError, JobfenceError
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore
from jobfence.settings import Settings
from jobfence.store import Store
from jobfence.store.types import Identity
from jobfence.wiring import open_cluster, open_object_store


class Report(Protocol):
    """A frozen dataclass of counts whose first field is ``function``."""

    @property
    def function(self) -> str: ...


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


MANUAL_ANNOTATION = "cronjob.kubernetes.io/instantiate"


def detect_trigger(settings: Settings, deps: Deps) -> str:
    """``scheduled`` or ``manual`` (see ``Settings.trigger``). Uncertain: scheduled."""
    if settings.trigger != "auto":
        return settings.trigger
    pod = os.environ.get("POD_NAME")
    if pod and settings.cluster == "kubernetes":
        try:
            cluster = deps.cluster
            job = cluster.pod_job_name(pod) if cluster else None
            annotations = cluster.job_annotations(job) if cluster and job else None
        except ClusterError as exc:
            get_logger("jobfence.runner").warning("trigger_unknown", error=str(exc))
            return "scheduled"
        return "manual" if (annotations or {}).get(MANUAL_ANNOTATION) == "manual" \
            else "scheduled"
    return "manual" if not pod and sys.stdin.isatty() else "scheduled"


def counts_of(report: Report) -> dict[str, Any]:
    data = asdict(report)  # type: ignore[call-overload]
    return {k: v for k, v in data.items() if k != "function"}


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
            trigger = detect_trigger(settings, deps)
            if not store.runs.try_lock(name):
                store.runs.run_started(function=name, trigger=trigger, skipped=True)
                log.info("pass_skipped", reason="another run holds the lock", trigger=trigger)
                cli.emit({"function": name, "skipped": True})
                metrics.push(settings, store, name)
                return 0
            run_id = store.runs.run_started(function=name, trigger=trigger)
            started = time.monotonic()
            log.info("pass_started", trigger=trigger)
            try:
                report = run_once(settings, deps)
            except BaseException as exc:
                message = str(exc) if isinstance(exc, JobfenceError) else repr(exc)
                log.error("pass_failed", error=message)
                with contextlib.suppress(Exception):  # the database may be what failed
                    store.runs.run_finished(run_id=run_id, function=name, trigger=trigger,
                                       succeeded=False, counts={}, error=message,
                                       duration_seconds=time.monotonic() - started)
                    metrics.push(settings, store, name)
                raise
            counts = counts_of(report)
            duration = round(time.monotonic() - started, 3)
            store.runs.run_finished(run_id=run_id, function=name, trigger=trigger, succeeded=True,
                               counts=counts, duration_seconds=duration)
            log.info("pass_finished", duration_seconds=duration, **counts)
            cli.emit({"function": name, **counts, "duration_seconds": duration})
            metrics.push(settings, store, name)
        return 0

    return cli.run_command(name, body)

