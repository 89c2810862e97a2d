"""enqueue: validate job specs, check drain, insert the jobs with their audit events, and
print one JSON object per spec. Invalid input writes nothing (exit 2). A ``--spec`` list is
read as a stream and written batch by batch in one transaction: memory stays flat however
long it is, and the answers are printed once it has committed. A workflow (one object
with ``workflow`` and its ``steps``) is written whole in one transaction, and answered with
one object: the workflow's id and each step's job."""

from __future__ import annotations

import gc
import itertools
import json
import os
import sys
from collections.abc import Iterator
from contextlib import nullcontext

from jobfence import cli
from jobfence.errors import InvalidSpec
from jobfence.spec import JobSpec, parse_action_arg, parse_specs
from jobfence.spec_stream import spec_batches, spec_items
from jobfence.store import Enqueued
from jobfence.submit import enqueued_object, submit_stream
from jobfence.workflows import (
    Workflow,
    is_workflow,
    parse_workflow,
    submit_workflow,
    submitted_object,
)


def parser() -> cli.Parser:
    p = cli.Parser(prog="jobfence enqueue", description=__doc__)
    p.add_argument("actions", nargs="*", metavar="ACTION",
                   help="NAME or NAME:JSON_PARAMS, run in order")
    p.add_argument("--spec", metavar="FILE", help="a JSON or YAML job spec (or list); - for stdin")
    p.add_argument("--resource")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--priority", type=int)
    p.add_argument("--after", action="append", default=[], metavar="JOB_ID")
    p.add_argument("--idempotency-key")
    p.add_argument("--ttl", metavar="DUR")
    p.add_argument("--timeout", metavar="DUR")
    p.add_argument("--inactivity-timeout", metavar="DUR",
                   help="stop an action that writes no output for this long (PT10M)")
    p.add_argument("--expires-in", metavar="DUR")
    p.add_argument("--inputs", metavar="s3://BUCKET/PREFIX")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--queue", metavar="Q", help="the queue (default: default)")
    p.add_argument("--group", metavar="G", help="the job's group (tenant, team, customer) "
                   "within its queue: a queue may limit each group and serve them in turn")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--run-at", metavar="TIMESTAMP",
                      help="not before this RFC 3339 time (2026-11-23T18:00:00Z)")
    when.add_argument("--delay", metavar="DUR", help="not before this ISO 8601 duration "
                      "from now (PT10M)")
    return p


def spec_batches_of(argv: list[str]
                    ) -> tuple[list[JobSpec], Iterator[list[JobSpec]]] | Workflow:
    """The specs to enqueue: the first batch, validated before anything is opened, and an
    iterator of the rest (a ``--spec`` list is read as a stream: ``jobfence.spec_stream``);
    or a workflow (one object with ``workflow``), validated whole."""
    args = parser().parse_args(argv)
    flags = {
        "resource": args.resource, "max_attempts": args.max_attempts,
        "priority": args.priority, "after": args.after or None,
        "idempotency_key": args.idempotency_key, "ttl": args.ttl, "timeout": args.timeout,
        "inactivity_timeout": args.inactivity_timeout, "expires_in": args.expires_in,
        "inputs": args.inputs, "queue": args.queue, "group": args.group,
        "run_at": args.run_at, "delay": args.delay,
    }
    if args.spec:
        if args.actions or any(v is not None for v in flags.values()) or args.label:
            raise InvalidSpec("give either --spec or ACTION arguments with flags, not both")
        items = _specs_in(args.spec)
        first = next(items)
        if first[0] == "spec" and is_workflow(first[1]):
            return parse_workflow(first[1])
        batches = spec_batches(itertools.chain([first], items))
        return next(batches), batches
    if not args.actions:
        raise InvalidSpec("nothing to enqueue: give ACTION arguments or --spec FILE")
    labels = cli.labels_of(args.label)
    spec = {k: v for k, v in flags.items() if v is not None}
    spec["actions"] = [parse_action_arg(a) for a in args.actions]
    if labels:
        spec["labels"] = labels
    return parse_specs(spec), iter(())


def _specs_in(path: str) -> Iterator[tuple[str, object, bool]]:
    """The specs of a file (``-``: stdin) as ``jobfence.spec_stream`` reads them; the file
    closed once they are read."""
    source = "stdin" if path == "-" else path
    try:
        with nullcontext(sys.stdin.buffer) if path == "-" else open(path, "rb") as stream:
            yield from spec_items(stream, source)
    except OSError as exc:
        raise InvalidSpec(f"cannot read spec {source!r}: {exc.strerror}") from None


def _line(job: Enqueued) -> str:
    if job.created and job.children is None:  # as json.dumps writes it, without its cost
        return f'{{"job_id": "{job.job_id}", "status": "{job.status}"}}\n'
    return json.dumps(enqueued_object(job)) + "\n"


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        # Collect less often: a batch's objects go by their counts (the start-up's are
        # frozen out of collections by the process entry, functions/cli.py), and a quarter
        # of a long list's time went to collections finding nothing.
        gc.set_threshold(50_000, 50, 100)
        given = spec_batches_of(list(sys.argv[1:] if argv is None else argv))
        settings = cli.setup("enqueue")
        if isinstance(given, Workflow):
            with cli.open_store(settings, "enqueue") as store:
                done = submit_workflow(settings, store, given, actor=cli.actor(),
                                       traceparent=os.environ.get("TRACEPARENT"))
            cli.emit(submitted_object(done))
            return 0
        first, rest = given
        with cli.open_store(settings, "enqueue") as store:
            # A script's trace, handed down as OpenTelemetry's environment carrier does.
            answers = submit_stream(
                settings, store, itertools.chain([first], rest),
                traceparent=os.environ.get("TRACEPARENT"),
                reopen=lambda: cli.connect_store(settings, "enqueue"))
            for batch in answers:
                sys.stdout.write("".join(_line(job) for job in batch))
        sys.stdout.flush()
        return 0

    return cli.run_command("enqueue", body)


if __name__ == "__main__":
    sys.exit(main())
