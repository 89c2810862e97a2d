"""Log lines on stderr, configured once per process: JSON lines (the shipped format) or the
console style for people (structlog's ``ConsoleRenderer``).

stdout is reserved for results a program reads; logs never go there.

The JSON format is written here, not by structlog: importing ``structlog`` imports every
module it has (its console renderer, and ``rich`` with it where that is installed), a
fifth of a short-lived function's start, and its chain of processors costs every line of a
worker's hot path more than the line itself. A JSON line is what structlog's
``JSONRenderer`` wrote: the call's keywords, ``event``, the context given to ``configure``
(bound to every line, whatever thread writes it), ``level`` and an ISO ``timestamp`` in
UTC; ``exc_info`` becomes ``exception`` (the formatted traceback); a value JSON cannot
hold is written as its ``repr``. The console format, and any line written before
``configure`` (an application using the Python API), still go through structlog, as before.
"""

from __future__ import annotations

import json
import sys
import threading
import traceback
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

from jobfence.terminal import harmless

DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
_LEVELS = {"debug": DEBUG, "info": INFO, "warning": WARNING, "error": ERROR}


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written: a caller (a test runner, an
    application) may replace the stream after loggers were made."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _Config:
    """The process's log configuration: ``json`` (written here), ``structlog`` (console
    style, or not configured yet), the least level written, the context of every line."""

    mode = "structlog"
    least = DEBUG
    context: dict[str, Any] = {}


_config = _Config()
_write_lock = threading.Lock()


def configure(fmt: str = "json", level: str = "info", **context: Any) -> None:
    """Configure this process's log lines; ``context`` is bound to every line."""
    least = _LEVELS.get(level, INFO)
    if fmt == "console":
        _configure_structlog(least, context)
        _config.mode = "structlog"
    else:
        _config.mode = "json"
    _config.least = least
    _config.context = dict(context)


def _configure_structlog(least: int, context: Mapping[str, Any]) -> None:
    import structlog

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _for_a_terminal,
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(least),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    if context:
        structlog.contextvars.bind_contextvars(**context)


def _for_a_terminal(_logger: Any, _method: str,
                    event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """The console format is read on a terminal, and a line may carry a job's bytes (its
    output, line by line; an error quoting its stderr): every text shown harmless
    (``jobfence.terminal``), as ``status`` shows it. JSON escapes them by itself."""
    return {k: harmless(v) if isinstance(v, str) else v for k, v in event.items()}


def _fallback(value: Any) -> Any:
    """What JSON cannot hold, as structlog's renderer wrote it."""
    render = getattr(value, "__structlog__", None)
    return render() if render is not None else repr(value)


def _json_line(level: str, event: str, kw: dict[str, Any]) -> str:
    line = {**kw, "event": event}
    for k, v in _config.context.items():
        line.setdefault(k, v)
    line["level"] = level
    line["timestamp"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    exc_info = line.pop("exc_info", None)
    if exc_info:
        if exc_info is True:
            exc_info = sys.exc_info()
        elif isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        if exc_info[0] is not None:
            line["exception"] = "".join(traceback.format_exception(*exc_info)).rstrip("\n")
    return json.dumps(line, default=_fallback)


class Logger:
    """A logger by name (the name is not written, as structlog did not): ``debug``,
    ``info``, ``warning``, ``error`` and ``exception`` with an event and keywords. A line
    below the configured level costs one comparison."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def _log(self, least: int, level: str, method: str, event: str, kw: dict[str, Any]) -> None:
        if _config.mode != "json":
            import structlog

            getattr(structlog.get_logger(self._name), method)(event, **kw)
            return
        if least < _config.least:
            return
        text = _json_line(level, event, kw) + "\n"
        with _write_lock:
            sys.stderr.write(text)
            sys.stderr.flush()

    def debug(self, event: str, **kw: Any) -> None:
        if _config.least <= DEBUG:
            self._log(DEBUG, "debug", "debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        if _config.least <= INFO:
            self._log(INFO, "info", "info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._log(WARNING, "warning", "warning", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._log(ERROR, "error", "error", event, kw)

    def exception(self, event: str, **kw: Any) -> None:
        """An error with the exception being handled (``exc_info``)."""
        kw.setdefault("exc_info", True)
        self._log(ERROR, "error", "exception", event, kw)


def get_logger(name: str) -> Logger:
    return Logger(name)
