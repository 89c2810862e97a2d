"""Actions: the steps a job runs, resolved by name.

Built-ins (``sleep``, ``command``) live in ``jobfence.actions.builtin``; installed packages
add more through the entry-point group ``jobfence.actions``, whose objects satisfy the
``Action`` protocol (or are classes that construct one with no arguments). An action may
also check the job's ``resource`` at enqueue (``ResourceValidator``): the table it would
compact must exist, say, before anything is written. An action that cannot do its work yet
(a rate limit, a resource not ready) raises ``Snooze``: its job runs again later without
spending an attempt. Which action a name resolves to: ``jobfence.actions.installed``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from uuid import UUID

if TYPE_CHECKING:
    from jobfence.actions.child import ChildEnvironment, ChildOutput, JobSpace, SpacePaths
    from jobfence.datums import Published

ENTRY_POINT_GROUP = "jobfence.actions"


class ActionFailed(Exception):
    """The action ran and failed; ``detail`` carries what helps a person (stderr tail), and
    ``result`` what it left, as a success's result says it (a command's exit code and
    output tails)."""

    def __init__(self, message: str, detail: str | None = None,
                 result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.detail = detail
        self.result = result


class StopRequested(Exception):
    """Raised inside an action when the attempt must stop (fence lost, cancel, SIGTERM)."""


MIN_SNOOZE = timedelta(milliseconds=1)
MAX_SNOOZE = timedelta(days=1)
"""The longest one snooze may be: a job that must wait longer snoozes again (each snooze
counts against ``JOBFENCE_MAX_SNOOZES``), or is better scheduled (``run_at``)."""


class Snooze(Exception):
    """Raised by an action's ``run`` to run its job again after ``delay`` (a ``timedelta``,
    or seconds) without spending an attempt: the job is pending again, visible after the
    delay, and this action runs again then (the actions before it that succeeded are not
    run again). The snooze is counted and recorded in the job's audit trail; a job that has
    snoozed ``JOBFENCE_MAX_SNOOZES`` times fails at its next one. ValueError for a delay
    that is not from a millisecond to a day."""

    def __init__(self, delay: timedelta | float) -> None:
        seconds = (delay.total_seconds() if isinstance(delay, timedelta)
                   else None if isinstance(delay, bool) or not isinstance(delay, int | float)
                   else float(delay))
        if seconds is None or not (
                MIN_SNOOZE.total_seconds() <= seconds <= MAX_SNOOZE.total_seconds()):
            raise ValueError(f"a snooze lasts from a millisecond to a day, not {delay!r}")
        self.delay = timedelta(seconds=seconds)
        self.result: dict[str, Any] | None = None
        """What the action had to say when it asked (a ``command``'s exit code and output
        tails): kept as its result for this claim, as a failure's is."""
        super().__init__(f"snooze for {seconds:g} s")


class AttemptFiles(Protocol):
    """The job's S3 inputs and outputs for this attempt (see jobfence.datums)."""

    def download_inputs(self, space: JobSpace) -> list[str]: ...

    def publish_outputs(self, space: JobSpace) -> Published: ...


class AttemptSpace:
    """An attempt's space (a ``JobSpace``: its directories and its user), opened on
    first use, so that a job that never runs a command costs no mkdir and no uid (on some
    container filesystems a mkdir costs more than the job's own database round trips); the
    inputs are downloaded into it once, before its first child."""

    def __init__(self, make: Callable[[], JobSpace]) -> None:
        self._make = make
        self._space: JobSpace | None = None
        self.paths: SpacePaths | None = None
        self.inputs_ready = False

    def open(self) -> tuple[JobSpace, SpacePaths]:
        if self._space is None:
            self._space = self._make()
        if self.paths is None:
            self.paths = self._space.open()
        return self._space, self.paths

    def close(self) -> None:
        space, self._space, self.paths = self._space, None, None
        self.inputs_ready = False
        if space is not None:
            space.close()


def _tails_only() -> ChildOutput:
    from jobfence.actions.child import ChildOutput

    return ChildOutput()


@dataclass
class ActionContext:
    """What a running action may use. ``stop`` is set the moment the attempt must end;
    long-running actions wait on it rather than sleeping, and register child processes with
    ``track_process`` so they can be killed from another thread."""

    job_id: UUID
    attempt_id: UUID
    action_index: int
    space: AttemptSpace
    """The job's space, where its ``command`` children run (never a place for the worker's
    own files: the job's code writes there)."""
    stop: threading.Event
    track_process: Callable[[int], None]
    untrack_process: Callable[[int], None]
    child_env: ChildEnvironment
    """Builds a child process's environment: away from the worker's keys."""
    files: AttemptFiles | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    unconfirmed: threading.Event = field(default_factory=threading.Event)
    """Set by an action when a child it started could not be confirmed gone (a command
    sidecar that did not answer): the job must not run again before its lease ends."""
    output: Callable[[], ChildOutput] = field(default=_tails_only)
    """Where a child's stdout and stderr go (one per child): its tails, and in a worker
    its log and S3 (``jobfence.worker.output``)."""
    touch: Callable[[], None] = field(default=lambda: None)
    """Report progress: an action that writes no output calls it to show it is not stuck
    (the inactivity timeout counts from the last output or touch)."""

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise StopRequested("the attempt was told to stop")


@runtime_checkable
class Action(Protocol):
    name: str

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Normalized params, or InvalidSpec saying what is wrong (called at enqueue)."""
        ...

    def run(self, ctx: ActionContext, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Do the work; return a small JSON-able result, raise to fail the attempt."""
        ...


@runtime_checkable
class ResourceValidator(Protocol):
    """What an action adds to check the job's ``resource`` at enqueue (optional)."""

    def validate_resource(self, resource: str | None, params: Mapping[str, Any]) -> None:
        """Return when a job with these (already validated) params may work on
        ``resource`` (None: the job names none); raise ``InvalidSpec`` (or ``ValueError``)
        saying why not — the enqueue is refused (exit 2, HTTP 400, ``InvalidSpec``) and
        nothing is written. ``Unavailable`` says the thing it asks cannot answer now (exit
        4, HTTP 503). Called before any statement, once per distinct (action, params,
        resource) of an enqueue call: a check that asks a catalog is paid once per table,
        not once per job."""
        ...
