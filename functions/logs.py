"""logs: a job's whole output — the stdout and stderr of each action of an attempt (the
latest unless ``--attempt``), from S3 where it went there, else the tails kept in the
database; or — ``--follow`` — as it comes, while the attempt runs. With one ``--stream``,
its bytes as they were written; else each stream under a header."""

from __future__ import annotations

import argparse
import sys
import time
from uuid import UUID

from jobfence import cli
from jobfence.adapters import open_object_store
from jobfence.errors import InvalidSpec
from jobfence.joblogs import STREAM_NAMES, Attempt, Logs, Piece, visible


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence logs", description="A job's whole output: the stdout "
                       "and stderr of each action of an attempt (the latest unless "
                       "--attempt), from S3 where it went there, else the tails kept in "
                       "the database. With one --stream, its bytes as they were written; "
                       "else each stream under a header.")
        p.add_argument("job_id")
        p.add_argument("--attempt", type=int, metavar="N", help="attempt N (from 1)")
        p.add_argument("--stream", choices=STREAM_NAMES, help="only this stream")
        p.add_argument("--action", type=int, metavar="N", help="only action N (from 1)")
        p.add_argument("-f", "--follow", action="store_true",
                       help="while the attempt runs, print what comes as it comes")
        p.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        job_id = cli.job_id(args.job_id)
        if not 0.05 <= args.interval <= 60:
            raise InvalidSpec("--interval must be between 0.05 and 60 seconds")
        settings = cli.setup("logs")
        with cli.open_store(settings, "logs") as store:
            identity = store.control.identity(settings.installation)
            assert identity.installation is not None
            logs = Logs(store, (lambda: open_object_store(settings)) if settings.s3_bucket
                        else None, settings.s3_bucket, identity.installation)
            attempt = logs.attempt(job_id, args.attempt)
            printer = _Printer(logs, job_id, attempt, args.stream, args.action)
            while True:
                running = args.follow and logs.still_running(job_id, attempt)
                printer.print_new(final=not running)
                if not running:
                    return 0
                time.sleep(args.interval)

    return cli.run_command("logs", body)


class _Printer:
    """Prints each piece of an attempt's output once, and of a piece on S3 the objects
    not printed yet."""

    def __init__(self, logs: Logs, job_id: UUID, attempt: Attempt, stream: str | None,
                 action: int | None) -> None:
        self.logs, self.job_id, self.attempt = logs, job_id, attempt
        self.stream, self.action = stream, action
        self.printed: dict[tuple[int, str], int] = {}
        self.headed: tuple[int, str] | None = None
        self.out = sys.stdout.buffer
        self.terminal = sys.stdout.isatty()
        """A person reads it: a job's control characters are shown, not obeyed (piped,
        the bytes are exactly what the job wrote)."""

    def print_new(self, *, final: bool) -> None:
        for piece in self.logs.pieces(self.job_id, self.attempt):
            if (self.stream and piece.stream != self.stream) or (
                    self.action and piece.action_index != self.action - 1):
                continue
            key = (piece.action_index, piece.stream)
            if not piece.on_s3 and key in self.printed:
                continue
            for seq, data in self.logs.read(self.job_id, self.attempt, piece,
                                            after=self.printed.get(key, 0)):
                self._head(piece)
                self.out.write(visible(data) if self.terminal else data)
                self.printed[key] = seq
            if final and not piece.whole:
                self._head(piece)
                sys.stderr.write(f"jobfence logs: only the last {len(piece.tail or '')} "
                                 f"characters of action {piece.action_index + 1}'s "
                                 f"{piece.stream} were kept ({piece.size} bytes written)\n")
        self.out.flush()

    def _head(self, piece: Piece) -> None:
        key = (piece.action_index, piece.stream)
        if self.stream is None and self.headed != key:
            size = "" if piece.size is None else f", {piece.size} bytes"
            self.out.write(f"==> attempt {self.attempt.number}, action "
                           f"{piece.action_index + 1} ({piece.action}): "
                           f"{piece.stream}{size} <==\n".encode())
            self.headed = key


if __name__ == "__main__":
    sys.exit(main())
