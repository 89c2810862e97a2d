"""Traces, optional (the extra ``jobfence[otel]``): a producer span at enqueue, a consumer
span per attempt, a span per action, the enqueue's W3C ``traceparent`` stored with the job
and handed to a ``command`` as ``TRACEPARENT``.

Nothing of OpenTelemetry is imported here: this module decides whether a process traces
and the parts that need no SDK (reading a traceparent, the span id of an attempt) are in
``jobfence.tracecontext``.
Everything that imports OpenTelemetry is in ``jobfence.otel``, imported only once a span is
actually to be made — a function that does not trace, or that traces but makes no span
(``status``, the sweeper), never pays for the import.

Who traces:

- jobfence's own processes (the CLI, the worker, ``serve``): ``cli.setup`` calls
  ``setup``, which decides from ``JOBFENCE_TRACING`` and the standard ``OTEL_*`` variables;
  the SDK is configured on the first span, and ``flush`` (at the command's end) exports
  what is left, bounded by ``JOBFENCE_TRACING_FLUSH_SECONDS``.
- an application (the Python API, ``setup`` never called): the enqueue joins the
  application's own tracing — its tracer provider, its current span — when the application
  has imported OpenTelemetry, unless ``JOBFENCE_TRACING=off``. jobfence never configures
  an SDK inside an application.

How the spans link (docs/DESIGN.md, "Traces"): the job stores its producer span's
traceparent; its first attempt's span is a child of it, so the application's trace runs
from its request through the enqueue into the worker. A later attempt (a retry, a job
given back on SIGTERM) starts a trace of its own, linked to the first attempt's span and
to the producer span. Its span id is derived from its attempt id, so a retry can name the
first attempt's span knowing only that attempt's id. A job enqueued without a trace
context gets a trace id derived from its job id, so that its retries link all the same.

The worker uses three things, each a no-op when the process does not trace:
``attempt_span`` (around an attempt), ``action_span`` (around an action) and
``child_env`` (the ``TRACEPARENT`` of the current span, for a child process).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from jobfence.errors import ConfigError, JobfenceError
from jobfence.logs import get_logger
from jobfence.settings import Settings
from jobfence.store.types import NewJob
from jobfence.tracecontext import AttemptSpan, parse_traceparent

if TYPE_CHECKING:
    from types import ModuleType

    from jobfence.store import Claim, Store

log = get_logger("jobfence.tracing")
T = TypeVar("T")

Mode = Literal["auto", "on", "off"]

def configured(mode: Mode, environ: Mapping[str, str]) -> bool:
    """Whether jobfence's own process traces, by ``JOBFENCE_TRACING`` and the standard
    OpenTelemetry variables."""
    if mode == "off":
        return False
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if mode == "on":
        return True
    exporter = environ.get("OTEL_TRACES_EXPORTER")
    if exporter is not None and exporter.strip():
        return any(e.strip().lower() not in ("", "none") for e in exporter.split(","))
    return any(environ.get(k, "").strip() for k in ("OTEL_EXPORTER_OTLP_ENDPOINT",
                                                     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")


def check_environment(environ: Mapping[str, str]) -> None:
    """ConfigError (exit 2, before any work) for a variable jobfence cannot honour."""
    for name in environ.get("OTEL_TRACES_EXPORTER", "").split(","):
        if name.strip().lower() not in ("", *EXPORTERS):
            raise ConfigError(f"OTEL_TRACES_EXPORTER: jobfence exports traces with "
                              f"{', '.join(EXPORTERS)}, not {name.strip()!r}")
    for var in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        value = environ.get(var, "").strip()
        if value and value not in PROTOCOLS:
            raise ConfigError(f"{var}: {value!r} is not supported ({', '.join(PROTOCOLS)})")


# -- whether this process traces -------------------------------------------------------------


@dataclass
class _Process:
    traces: bool
    required: bool
    function: str
    flush_seconds: float
    backend: ModuleType | None = None


class _Here:
    process: _Process | None = None
    """jobfence's own process, once ``setup`` ran; None inside an application."""


_here = _Here()


def setup(settings: Settings, function: str) -> None:
    """Decide whether this process (a jobfence command) traces; imports nothing. With
    ``JOBFENCE_TRACING=on``, a missing extra is a ConfigError now, not at the first span."""
    traces = configured(settings.tracing, os.environ)
    if traces:
        check_environment(os.environ)
    _here.process = _Process(traces, settings.tracing == "on", function,
                             settings.tracing_flush_seconds)
    if traces and settings.tracing == "on":
        _backend()


def _backend() -> ModuleType | None:
    """``jobfence.otel`` with the SDK configured, when this process traces; else None."""
    process = _here.process
    if process is None or not process.traces:
        return None
    if process.backend is None:
        try:
            from jobfence import otel

            otel.configure(process.function)
        except Exception as exc:  # never a job's failure: this process goes on untraced
            process.traces = False
            if process.required:
                if isinstance(exc, ImportError):
                    raise ConfigError("JOBFENCE_TRACING=on needs the OpenTelemetry packages: "
                                      "pip install 'jobfence[otel]'") from None
                raise ConfigError(f"JOBFENCE_TRACING=on: {exc}") from None
            log.warning("tracing_unavailable", error=f"{type(exc).__name__}: {exc}",
                        message="the OTEL_* variables ask for traces, but they cannot be "
                                "made: no spans from this process")
            return None
        process.backend = otel
    return process.backend


def _for_enqueue(settings: Settings) -> ModuleType | None:
    """The backend an enqueue's producer span uses: this process's, or inside an
    application the application's own tracing, when it has imported OpenTelemetry."""
    if _here.process is not None:
        return _backend()
    if settings.tracing == "off" or "opentelemetry.trace" not in sys.modules:
        return None
    from jobfence import otel

    return otel


def flush() -> None:
    """Export what is left before the process exits (bounded); nothing when no span was
    made."""
    process = _here.process
    if process is not None and process.backend is not None:
        backend, process.backend = process.backend, None
        backend.flush(process.flush_seconds)


# -- spans -----------------------------------------------------------------------------------


class EnqueueTrace:
    """What the jobs of one enqueue carry (``traceparent``: the producer span's, else the
    caller's own when valid, else None), and what the producer span says of them: every
    batch written is ``sent`` here (an enqueue streamed from a long list is not held
    whole), and the span's name and attributes are set from them when it ends."""

    def __init__(self, traceparent: str | None) -> None:
        self.traceparent = traceparent
        self.queues: set[str] = set()
        self.count = 0
        self.first: NewJob | None = None

    def sent(self, jobs: Sequence[NewJob]) -> None:
        if jobs and self.first is None:
            self.first = jobs[0]
        self.count += len(jobs)
        self.queues.update(j.queue for j in jobs)


@contextmanager
def enqueue_span(settings: Settings, traceparent: str | None = None) -> Iterator[EnqueueTrace]:
    """One enqueue, inside its producer span (a child of ``traceparent``, else of the
    current context) where this process traces. Where nothing traces, the jobs carry
    ``traceparent`` itself when it is a valid one, so that a tracing worker still joins the
    caller's trace."""
    backend = _for_enqueue(settings)
    caller = parse_traceparent(traceparent)
    if backend is None:
        yield EnqueueTrace(str(caller) if caller else None)
        return
    with backend.producer(caller) as (made, ended):
        traced = EnqueueTrace(str(made) if made else None)
        try:
            yield traced
        finally:
            ended(sorted(traced.queues), traced.count, traced.first)


@contextmanager
def attempt_span(read: Callable[[Callable[[Store], Any]], Any], claim: Claim,
                 queue: str) -> Iterator[AttemptSpan]:
    """The consumer span of one attempt, current while its actions run. Reads the job's
    trace context once through ``read`` (the worker's connection: a fenced read, apart from
    the claim); a failure to read it costs the span its parent, never the attempt."""
    backend = _backend()
    if backend is None:
        yield AttemptSpan()
        return
    try:
        found = read(lambda store: store.traces.for_attempt(claim.job_id, claim.attempt_id))
    except JobfenceError as exc:
        log.warning("trace_context_unread", job_id=str(claim.job_id), error=str(exc))
        found = None
    traceparent = parse_traceparent(found.traceparent) if found else None
    first = found.first_span_id if found else None
    with backend.attempt(claim, queue, traceparent, first) as span:
        yield span


@contextmanager
def action_span(index: int, name: str) -> Iterator[None]:
    """The span of one action of the current attempt."""
    backend = _backend()
    if backend is None:
        yield
        return
    with backend.action(index, name):
        yield


def child_env() -> dict[str, str]:
    """``TRACEPARENT`` (and ``TRACESTATE``) of the current span, for a child process's
    environment; empty when this process does not trace."""
    backend = _backend()
    if backend is None:
        return {}
    env: dict[str, str] = backend.carrier()
    return env
