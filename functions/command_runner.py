"""command-runner: the command sidecar of a worker pod (``jobfence.sidecar``). Listens on a
unix socket in the volume it shares with the worker and runs each job's ``command`` child
the worker asks for, streaming its output back; the child gets no database URL, no
Secret and no API token because this container has none. Runs until SIGTERM (the pod going
away), which kills the child in hand; exit 0.

Needs no database and reads no settings but its own: ``--socket`` (default
``JOBFENCE_COMMAND_SOCKET``) and, when it runs as root, ``JOBFENCE_COMMAND_USER`` (the
user its children run as, ``nobody`` unless set).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jobfence import cli, logs
from jobfence.errors import ConfigError
from jobfence.proctree import become_subreaper
from jobfence.sandbox import Sandbox
from jobfence.shutdown import on_termination
from jobfence.sidecar import CommandRunner


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence command-runner", description=__doc__)
        p.add_argument("--socket", default=os.environ.get("JOBFENCE_COMMAND_SOCKET") or None,
                       help="the socket to listen on (default: JOBFENCE_COMMAND_SOCKET)")
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        if not args.socket:
            raise ConfigError("command-runner: --socket or JOBFENCE_COMMAND_SOCKET is required")
        logs.configure(os.environ.get("JOBFENCE_LOG_FORMAT") or "json",
                       os.environ.get("JOBFENCE_LOG_LEVEL") or "info", command="command-runner")
        try:
            sandbox = Sandbox.configured(os.environ.get("JOBFENCE_COMMAND_USER") or "nobody")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        path = Path(args.socket)
        if not path.parent.is_dir():
            raise ConfigError(f"command-runner: no directory {str(path.parent)!r} for the socket")
        become_subreaper()  # what a child leaves behind stays ours to kill
        runner = CommandRunner(path, sandbox)
        with on_termination(lambda _signum: runner.stop()):
            runner.serve()
        cli.emit({"function": "command-runner", "served": runner.served})
        return 0

    return cli.run_command("command-runner", body)
