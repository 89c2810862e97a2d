"""command-runner: the command sidecar of a worker pod (``jobfence.worker.sidecar``). Dials the
worker's socket (``--socket``, in a directory only the worker may write) once the worker
listens, keeps that one connection, and runs each job's ``command`` children the worker
asks for in the job's space under ``--scratch``, streaming their output back and handing
the worker descriptors of the job's input and output files. The children get no database
URL, no Secret and no API token because this container has none. When a worker goes away
its child is killed and the runner dials again; SIGTERM (the pod going away) kills the
child in hand; exit 0.

Needs no database and reads no settings but its own: ``--socket`` (default
``JOBFENCE_COMMAND_SOCKET``), ``--scratch`` and, when it runs as root,
``JOBFENCE_COMMAND_USER`` and ``JOBFENCE_COMMAND_UIDS`` (unset user: a uid of its own per
job; ``jobfence.jobuids``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jobfence import cli, logs
from jobfence.errors import ConfigError
from jobfence.jobuids import DEFAULT_UIDS, users_for
from jobfence.shutdown import on_termination
from jobfence.worker.proctree import become_subreaper
from jobfence.worker.sandbox import protect_worker
from jobfence.worker.sidecar.serve import SidecarServer


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence command-runner", description=__doc__)
        p.add_argument("--socket", default=os.environ.get("JOBFENCE_COMMAND_SOCKET") or None,
                       help="the worker's socket to dial (default: JOBFENCE_COMMAND_SOCKET)")
        p.add_argument("--scratch", type=Path, default=None,
                       help="a directory of the runner's own for the jobs' spaces; what the "
                            "children's user leaves in it is removed after each job (the "
                            "shipped pod: its /tmp volume). Default: the temporary "
                            "directory, where nothing but the job's space is removed")
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        if not args.socket:
            raise ConfigError("command-runner: --socket or JOBFENCE_COMMAND_SOCKET is required")
        logs.configure(os.environ.get("JOBFENCE_LOG_FORMAT") or "json",
                       os.environ.get("JOBFENCE_LOG_LEVEL") or "info", command="command-runner")
        try:
            users = users_for(os.environ.get("JOBFENCE_COMMAND_USER") or None,
                              os.environ.get("JOBFENCE_COMMAND_UIDS") or DEFAULT_UIDS)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if args.scratch is not None and not args.scratch.is_dir():
            raise ConfigError(f"command-runner: --scratch {str(args.scratch)!r} is not a "
                              "directory")
        become_subreaper()  # what a child leaves behind stays ours to kill
        protect_worker()  # the jobs' env passes through here: closed to their children
        runner = SidecarServer(Path(args.socket), users, args.scratch)
        with on_termination(lambda _signum: runner.stop()):
            runner.serve()
        cli.emit({"function": "command-runner", "served": runner.served})
        return 0

    return cli.run_command("command-runner", body)
