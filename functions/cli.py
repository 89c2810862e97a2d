"""The ``jobfence`` command: dispatches to one module per entrypoint, imported lazily so a
short-lived function pays only for what it uses."""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, cast

from jobfence.commands import COMMANDS


def usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: jobfence COMMAND [ARGS...] | --version", "", "commands:"]
    lines += [f"  {n.ljust(width)}  {h}" for n, (_, h) in COMMANDS.items()]
    lines += ["", "Run `jobfence COMMAND --help` for a command's options."]
    return "\n".join(lines)


def resolve(name: str) -> Callable[[list[str]], int]:
    target, _ = COMMANDS[name]
    module, _, func = target.partition(":")
    loaded = importlib.import_module(f"jobfence.functions.{module}")
    return cast(Callable[[list[str]], int], getattr(loaded, func))


Command = Callable[[list[str]], int]


def dispatch(argv: Sequence[str] | None = None) -> tuple[Command, list[str]] | int:
    """The command's function (its module imported) and its arguments, or the exit code
    when there is nothing to run (help, an unknown command)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(f"jobfence: error: a command is required\n\n{usage()}\n")
        return 2
    if args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("--version", "-V", "version"):
        from jobfence.version import version

        print(f"jobfence {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        shown = name.encode("utf-8", "backslashreplace").decode("utf-8")[:80]
        sys.stderr.write(f"jobfence: error: unknown command {shown!r}\n\n{usage()}\n")
        return 2
    return resolve(name), rest


def main(argv: Sequence[str] | None = None) -> int:
    found = dispatch(argv)
    if isinstance(found, int):
        return found
    command, rest = found
    return command(rest)


def run() -> NoReturn:
    """The process's entry (the ``jobfence`` script, ``python -m jobfence.functions.cli``): ``main``
    with the garbage collector set for a short-lived process. No collection runs while the
    command's modules load (start-up allocates much and frees little); what they built is
    then frozen out of every later collection; and everything is frozen before exit, so
    the interpreter's teardown does not first collect what the process is about to drop.
    About a sixth of a periodic function's cold start. And no pydantic plugin is looked for
    (``PYDANTIC_DISABLE_PLUGINS``, unless set): the look reads every installed package's
    entry points at the first model built, about 8% of it; a job's command never inherits
    the setting (its environment is named, ``jobfence.worker.sandbox``)."""
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    gc.disable()
    found = dispatch()
    gc.freeze()
    gc.enable()
    if isinstance(found, int):
        sys.exit(found)
    command, rest = found
    try:
        code = command(rest)
    finally:
        gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
