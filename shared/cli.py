"""Plumbing shared by every command: settings, logging, the store, JSON on stdout, and the
one place where errors become the contract's exit codes and a message on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from jobfence import logs, tracing
from jobfence.db import connect
from jobfence.errors import ExitCode, InvalidSpec, JobfenceError, NotMigrated
from jobfence.ids import parse_job_id
from jobfence.jsonable import to_jsonable
from jobfence.limits import Unstorable, check_text, queue_name
from jobfence.settings import Settings, load_settings
from jobfence.store import Store

_read: list[Settings] = []
"""This process's settings once ``setup`` has read them (where a refusal may look)."""


def actor() -> str:
    """Who runs this command, as recorded with what it changes (``control_events``): the
    operating system's user at this host."""
    import os
    import socket

    user = os.environ.get("USER") or os.environ.get("LOGNAME") or f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"[:200]


def emit(obj: Any) -> None:
    """One JSON document on stdout."""
    emit_lines([obj])


def emit_lines(objs: Sequence[Any]) -> None:
    """JSON documents on stdout, one per line, written at once."""
    sys.stdout.write("".join(json.dumps(to_jsonable(o)) + "\n" for o in objs))
    sys.stdout.flush()


def error(message: str) -> None:
    """One line on stderr, whatever the message holds."""
    line = " ".join(message.split()) if "\n" in message or "\r" in message else message
    line = line.encode("utf-8", "backslashreplace").decode("utf-8")
    sys.stderr.write(f"jobfence: error: {line}\n")
    sys.stderr.flush()


class Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as exit 2 with the contract's message form, and
    refuses arguments that are not text PostgreSQL can hold (invalid UTF-8, NUL) before
    anything else looks at them."""

    def error(self, message: str) -> Any:
        raise InvalidSpec(f"{self.prog}: {message}")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: None = None) -> argparse.Namespace:
        for i, arg in enumerate(sys.argv[1:] if args is None else args):
            try:
                check_text(arg, f"argument {i + 1}")
            except Unstorable as exc:
                raise InvalidSpec(f"{self.prog}: {exc}") from None
        return super().parse_args(args, namespace)


def job_id(text: str) -> UUID:
    """A job id given on the command line; InvalidSpec (exit 2) saying why it is not one."""
    try:
        return parse_job_id(text)
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None


def labels_of(items: Sequence[str]) -> dict[str, str]:
    """``--label KEY=VALUE`` arguments as a mapping (InvalidSpec naming a malformed one)."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidSpec(f"--label {item[:80]!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def queue_of(text: str) -> str:
    """A queue's name given on the command line; InvalidSpec (exit 2) saying why it is not
    one."""
    try:
        return queue_name(text)
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None


def warn(message: str) -> None:
    """One warning line on stderr (the command goes on)."""
    sys.stderr.write(f"jobfence: warning: {message}\n")
    sys.stderr.flush()


def run_command(name: str, body: Callable[[], int]) -> int:
    """Run a command body; map every error to its exit code and one line on stderr. The
    spans it made are exported before it returns (``jobfence.tracing``)."""
    try:
        return body()
    except NotMigrated as exc:
        error(_versions_named(exc, name))
        return int(exc.exit_code)
    except JobfenceError as exc:
        error(str(exc))
        return int(exc.exit_code)
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except BrokenPipeError:
        return int(ExitCode.OK)
    except RecursionError:
        error(f"{name}: the input is nested too deep")
        return int(ExitCode.INVALID)
    except Exception as exc:
        logs.get_logger(name).exception("command_crashed", command=name)
        error(f"{name} failed unexpectedly: {type(exc).__name__}: {exc}")
        return int(ExitCode.FAILED)
    finally:
        _flush_traces(name)


def _versions_named(exc: NotMigrated, name: str) -> str:
    """The refusal of a database whose schema is not the one this release calls, saying
    which it is: older (run ``migrate``), or moved on by a newer release's migrate (in a
    rolling deploy, a pod of the release before whose functions are gone)."""
    if not _read or exc.missing is None:
        return str(exc)
    from jobfence.store.migrations import available

    try:
        store = connect_store(_read[0], name)
        try:
            at = store.control.schema_version()
        finally:
            store.conn.close()
    except JobfenceError:  # no schema at all, or no answer: the refusal as it was
        return str(exc)
    knows = len(available())
    if at > knows:
        return (f"the database was migrated by a newer release (to migration {at:04d}; this "
                f"release knows up to {knows:04d}) that no longer has what this one calls "
                f"({exc.missing}): run the newer release")
    if at < knows:
        return (f"the database is at migration {at:04d} and this release needs {knows:04d} "
                f"({exc.missing}): run `jobfence migrate`")
    return str(exc)


def _flush_traces(name: str) -> None:
    try:
        tracing.flush()
    except Exception as exc:  # traces never change how a command ends
        logs.get_logger(name).warning("traces_not_exported", error=str(exc))


def setup(name: str, **overrides: object) -> Settings:
    """Settings and logging for a command run."""
    settings = load_settings(**overrides)
    _read[:] = [settings]
    logs.configure(settings.log_format, settings.log_level, command=name)
    tracing.setup(settings, name)
    return settings


@contextmanager
def open_store(settings: Settings, name: str) -> Iterator[Store]:
    store = connect_store(settings, name)
    try:
        yield store
    finally:
        store.conn.close()


def connect_store(settings: Settings, name: str) -> Store:
    """The store on a new connection of command ``name`` (the caller closes it)."""
    conn = connect(settings.database_url, pooler=settings.database_pooler,
                   application_name=f"jobfence-{name}",
                   connect_timeout=settings.connect_timeout_seconds)
    return Store(conn, settings.schema_name)
