"""structlog JSON lines on stderr (console style for people), configured once per process.

stdout is reserved for results a program reads; logs never go there.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from jobfence.terminal import harmless


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written: loggers are cached on first use,
    and a caller (a test runner, an application) may replace the stream later."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def configure(fmt: str = "json", level: str = "info", **context: Any) -> None:
    """Configure structlog for this process; ``context`` is bound to every line."""
    console = fmt == "console"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if console
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *((_for_a_terminal,) if console else ()),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
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


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
