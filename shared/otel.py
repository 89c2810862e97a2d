"""The OpenTelemetry side of ``jobfence.tracing``: the only module of jobfence that imports
OpenTelemetry, itself imported only when a span is to be made (the extra
``jobfence[otel]``). ``jobfence.tracing`` says when and how the spans link.

``configure`` sets up the SDK for a jobfence process from the standard variables: the
resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``; ``service.name`` is
``jobfence`` where neither names one), the sampler (``OTEL_TRACES_SAMPLER``), the exporters
(``OTEL_TRACES_EXPORTER``: ``otlp``, the default, and ``console``), and the OTLP exporter's
own (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``..._HEADERS``, ``..._TIMEOUT``...; OTLP over HTTP
with protobuf, or gRPC where ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` and its exporter package is
installed). Spans go out in batches; ``flush`` exports the rest at the process's end.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from jobfence.actions import Snooze
from jobfence.errors import ConfigError
from jobfence.logs import get_logger
from jobfence.store.types import NewJob
from jobfence.tracecontext import AttemptSpan, TraceParent, attempt_span_id, job_trace_id

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from jobfence.store import Claim

T = TypeVar("T")

SCOPE = "jobfence"
SYSTEM = "jobfence"
_PROPAGATOR = TraceContextTextMapPropagator()


class _SDK:
    provider: TracerProvider | None = None
    """This process's provider while it is open (a jobfence process, not an application)."""
    global_set = False
    """Whether it was made the global provider (plugins' own spans join ours): only the
    first one can be."""


_sdk = _SDK()

_forced: contextvars.ContextVar[tuple[int | None, int | None]] = contextvars.ContextVar(
    "jobfence_forced_ids", default=(None, None))
"""The trace and span ids the next span must have (an attempt's span), else random."""


@functools.cache
def _version() -> str:
    from jobfence.version import version

    return version()


def _tracer() -> trace.Tracer:
    if _sdk.provider is not None:
        return _sdk.provider.get_tracer(SCOPE, _version())
    return trace.get_tracer(SCOPE, _version())  # inside an application: its provider


# -- the SDK of a jobfence process -------------------------------------------------------------


def configure(function: str) -> None:
    """The process's tracer provider, from the standard variables (once)."""
    if _sdk.provider is not None:
        return
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class AttemptIds(RandomIdGenerator):
        """Random ids, except for an attempt's span (``_forced``)."""

        def generate_span_id(self) -> int:
            span_id = _forced.get()[1]
            return span_id if span_id is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            trace_id = _forced.get()[0]
            return trace_id if trace_id is not None else super().generate_trace_id()

    resource = Resource.create({"jobfence.function": function})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "jobfence"}))
    # No flush at the interpreter's exit: ``flush`` does it, bounded.
    provider = TracerProvider(resource=resource, id_generator=AttemptIds(),
                              shutdown_on_exit=False)
    for exporter in _exporters():
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _sdk_logs_to_ours()
    if not _sdk.global_set:
        trace.set_tracer_provider(provider)
        _sdk.global_set = True
    _sdk.provider = provider


class _ToOurLog(logging.Handler):
    """The SDK's own messages (an export that failed...) as jobfence's log lines."""

    def emit(self, record: logging.LogRecord) -> None:
        event = get_logger("jobfence.tracing")
        say = event.error if record.levelno >= logging.ERROR else event.warning
        say("tracing_sdk", logger=record.name, message=record.getMessage())


def _sdk_logs_to_ours() -> None:
    sdk = logging.getLogger("opentelemetry")
    if not any(isinstance(h, _ToOurLog) for h in sdk.handlers):
        sdk.addHandler(_ToOurLog(logging.WARNING))
        sdk.propagate = False


def _exporters() -> list[Any]:
    names = [n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    made: list[Any] = []
    for name in names:
        if name in ("", "none"):
            continue
        if name == "otlp":
            made.append(_otlp())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            made.append(ConsoleSpanExporter())
        else:
            raise ConfigError(f"OTEL_TRACES_EXPORTER: jobfence exports traces with otlp or "
                              f"console, not {name!r}")
    return made


def _otlp() -> Any:
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise ConfigError("OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the package "
                              "opentelemetry-exporter-otlp-proto-grpc (jobfence[otel] "
                              "exports over http/protobuf)") from None
        return GrpcExporter()
    if protocol != "http/protobuf":
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported "
                          "(http/protobuf or grpc)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def flush(timeout_seconds: float) -> None:
    """Export the spans still in the batch, waiting at most ``timeout_seconds``. The SDK's
    own flush waits for an export in progress, and an exporter retries an unreachable
    collector until its own timeout: the flush runs on a thread of its own, which the
    process leaves behind (a daemon) once the bound has passed."""
    provider, _sdk.provider = _sdk.provider, None
    if provider is None:
        return

    def run() -> None:
        provider.force_flush(int(timeout_seconds * 1000))
        provider.shutdown()

    done = threading.Thread(target=run, name="jobfence-traces-flush", daemon=True)
    done.start()
    done.join(timeout_seconds)
    if done.is_alive():
        get_logger("jobfence.tracing").warning(
            "traces_not_exported", seconds=timeout_seconds,
            message="spans still unexported at JOBFENCE_TRACING_FLUSH_SECONDS: left behind")


# -- spans -------------------------------------------------------------------------------------


def _remote(parent: TraceParent, span_id: int | None = None) -> SpanContext:
    return SpanContext(parent.trace_id, parent.span_id if span_id is None else span_id,
                       is_remote=True, trace_flags=TraceFlags(parent.flags))


def _traceparent(span: Span) -> TraceParent | None:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return TraceParent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))


Described = Callable[[Sequence[str], int, "NewJob | None"], None]
"""Called once the jobs are written: their queues, how many, the first."""


@contextmanager
def producer(caller: TraceParent | None) -> Iterator[tuple[TraceParent | None, Described]]:
    """The enqueue's producer span, current while the jobs are written: its traceparent,
    and what names the span once the jobs are known (``enqueue QUEUE``, the message count
    or, for one job, its id)."""
    parent = (trace.set_span_in_context(NonRecordingSpan(_remote(caller))) if caller
              else otel_context.get_current())
    with _tracer().start_as_current_span("enqueue", context=parent, kind=SpanKind.PRODUCER,
                                         attributes={
                                             "messaging.system": SYSTEM,
                                             "messaging.operation.type": "send",
                                             "messaging.operation.name": "enqueue"}) as span:

        def described(queues: Sequence[str], count: int, first: NewJob | None) -> None:
            span.set_attribute("messaging.destination.name", ",".join(queues))
            if count == 1 and first is not None:
                span.set_attribute("messaging.message.id", str(first.job_id))
                span.set_attribute("jobfence.job.id", str(first.job_id))
            else:
                span.set_attribute("messaging.batch.message_count", count)
            if len(queues) == 1:
                span.update_name(f"enqueue {queues[0]}")

        yield _traceparent(span), described


class _Attempt(AttemptSpan):
    def __init__(self, span: Span) -> None:
        self.span = span

    def ended(self, outcome: T) -> T:
        value = str(outcome)
        self.span.set_attribute("jobfence.outcome", value)
        if value not in ("succeeded", "snoozed"):  # a snooze asks for later: no error
            self.span.set_status(Status(StatusCode.ERROR, f"the attempt ended {value}"))
        return outcome


@contextmanager
def attempt(claim: Claim, queue: str, stored: TraceParent | None,
            first_span_id: int | None) -> Iterator[AttemptSpan]:
    """The attempt's consumer span: the first attempt a child of the producer span, a later
    one a trace of its own linked to the first attempt's span and the producer span."""
    span_id = attempt_span_id(claim.attempt_id)
    first = first_span_id is None or first_span_id == span_id
    trace_id = stored.trace_id if stored else job_trace_id(claim.job_id)
    links: list[Link] = []
    if first:
        parent = (trace.set_span_in_context(NonRecordingSpan(_remote(stored))) if stored
                  else otel_context.Context())
        forced = (None if stored else trace_id, span_id)
    else:
        assert first_span_id is not None
        flags = TraceFlags(stored.flags if stored else TraceFlags.SAMPLED)
        links.append(Link(SpanContext(trace_id, first_span_id, is_remote=True,
                                      trace_flags=flags), {"jobfence.link": "first_attempt"}))
        if stored:
            links.append(Link(_remote(stored), {"jobfence.link": "enqueue"}))
        parent = otel_context.Context()
        forced = (None, span_id)
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM, "messaging.operation.type": "process",
        "messaging.operation.name": "process", "messaging.destination.name": queue,
        "messaging.message.id": str(claim.job_id), "jobfence.job.id": str(claim.job_id),
        "jobfence.attempt.id": str(claim.attempt_id),
        "jobfence.attempt.number": claim.attempt_count,
        "jobfence.attempt.max": claim.max_attempts,
    }
    if claim.parent_id is not None:
        attributes["jobfence.job.parent_id"] = str(claim.parent_id)
    token = _forced.set(forced)
    try:
        span = _tracer().start_span(f"process {queue}", context=parent, kind=SpanKind.CONSUMER,
                                    attributes=attributes, links=links)
    finally:
        _forced.reset(token)
    with trace.use_span(span, end_on_exit=True):
        yield _Attempt(span)


@contextmanager
def action(index: int, name: str) -> Iterator[None]:
    """One action's span, a child of the current (attempt's) span. An exception out of the
    action is recorded on it (the attempt's span says how the attempt ended) — but a snooze
    is no error: its delay is an attribute (``jobfence.action.snoozed_seconds``)."""
    with _tracer().start_as_current_span(
            f"action {name}", kind=SpanKind.INTERNAL, record_exception=False,
            set_status_on_exception=False,
            attributes={"jobfence.action.name": name, "jobfence.action.index": index}) as span:
        try:
            yield
        except Snooze as snooze:
            span.set_attribute("jobfence.action.snoozed_seconds", snooze.delay.total_seconds())
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def carrier() -> dict[str, str]:
    """The current span's context as environment variables (``TRACEPARENT``,
    ``TRACESTATE``)."""
    found: dict[str, str] = {}
    _PROPAGATOR.inject(found)
    return {k.upper(): v for k, v in found.items() if k in ("traceparent", "tracestate")}
