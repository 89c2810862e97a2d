"""The W3C trace context, read and written, and the ids jobfence derives from its own (an
attempt's span id from its attempt id, a job's trace id from its job id): what tracing
needs without OpenTelemetry, shared by ``jobfence.tracing`` (whether and when a process
traces) and ``jobfence.otel`` (the spans)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TypeVar
from uuid import UUID

T = TypeVar("T")

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
MAX_HEADER = 512
"""A traceparent longer than this is not read (a future version's fields included)."""


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A W3C trace context's ``traceparent``, parsed."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)

    def __str__(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """``value`` read as the W3C Trace Context says a receiver reads it; None when it is
    not a valid traceparent (then the caller goes on as if none was given). Version 00 has
    exactly four fields; a later version may add fields after them, which are ignored."""
    if not value or len(value) > MAX_HEADER:
        return None
    m = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        return None
    return TraceParent(int(trace_id, 16), int(span_id, 16), int(flags, 16) & 0xFF)


def _digest(value: UUID, what: bytes) -> bytes:
    return hashlib.sha256(what + b"\0" + value.bytes).digest()


def attempt_span_id(attempt_id: UUID) -> int:
    """The span id of an attempt's span: derived from its attempt id, as the database
    derives it for a retry (worker_trace, migration 0026)."""
    return int.from_bytes(_digest(attempt_id, b"attempt")[:8], "big")


def job_trace_id(job_id: UUID) -> int:
    """The trace id of a job enqueued without a trace context: derived from its id."""
    return int.from_bytes(_digest(job_id, b"job")[:16], "big") or 1


class AttemptSpan:
    """What the worker tells an attempt's span: how the attempt ended."""

    def ended(self, outcome: T) -> T:
        """Record ``outcome`` (a StrEnum such as the worker's Outcome) and return it."""
        return outcome
