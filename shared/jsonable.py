"""jobfence's values as JSON, the same on every surface: the CLI's output, the HTTP API's
bodies, the Python API's objects."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from jobfence.durations import format_duration


def to_jsonable(value: Any) -> Any:
    """``value`` with ids, times, durations, dataclasses and rows made JSON values."""
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return format_duration(value)
    if is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(asdict(value))
    if isinstance(value, tuple) and hasattr(value, "_asdict"):  # a NamedTuple row
        return to_jsonable(value._asdict())
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value
