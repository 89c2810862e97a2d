"""enqueue: validate job specs, check drain, insert the jobs with their audit events, and
print one JSON object per spec. Invalid input writes nothing (exit 2)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from jobfence import cli
from jobfence.datums import child_batches
from jobfence.errors import InvalidSpec, NotFound, Unavailable
from jobfence.ids import uuid7
from jobfence.limits import MAX_SPEC_BYTES
from jobfence.objectstore import ObjectStore, ObjectStoreError, output_bucket
from jobfence.settings import Settings
from jobfence.spec import (
    JobSpec,
    decode_spec_bytes,
    parse_action_arg,
    parse_spec_text,
    parse_specs,
    seconds,
)
from jobfence.store import Enqueued, NewJob, Store
from jobfence.wiring import open_object_store


@dataclass(frozen=True, slots=True)
class Report:
    function: str
    jobs: tuple[Enqueued, ...]


def to_new_job(spec: JobSpec, settings: Settings) -> NewJob:
    parent = spec.inputs is not None
    return NewJob(
        is_parent=parent,
        inputs=spec.inputs.model_dump() if spec.inputs else None,
        job_id=uuid7(),
        actions=spec.stored_actions(),
        max_attempts=spec.max_attempts or settings.max_attempts,
        resource=spec.resource,
        priority=spec.priority,
        after=tuple(spec.after),
        labels=dict(spec.labels),
        ttl_seconds=seconds(spec.ttl),
        timeout_seconds=seconds(spec.timeout),
        expires_in_seconds=seconds(spec.expires_in),
        idempotency_key=spec.idempotency_key,
        spec_hash=spec.fingerprint() if spec.idempotency_key else None,
        queue=spec.queue,
        run_at=spec.run_at,
        delay_seconds=seconds(spec.delay),
    )


def run_once(settings: Settings, store: Store, specs: Sequence[JobSpec],
             objects: Callable[[], ObjectStore] | None = None) -> Report:
    """Insert the jobs; a spec with S3 ``inputs`` becomes a parent with one child per
    datum, listed and inserted in the same transaction."""
    jobs = [to_new_job(spec, settings) for spec in specs]
    if not any(job.is_parent for job in jobs):
        return Report("enqueue", tuple(store.jobs.enqueue(jobs)))
    output_bucket(settings)  # outputs and the manifest need a bucket: say so before listing
    opened = objects or (lambda: open_object_store(settings))

    def children(parent: NewJob) -> Iterator[list[NewJob]]:
        inputs = parent.inputs
        return child_batches(inputs["url"], inputs["per_datum"], opened())(parent)

    try:
        return Report("enqueue", tuple(store.jobs.enqueue(jobs, children=children)))
    except ObjectStoreError as exc:
        if exc.code == "NoSuchBucket":
            raise NotFound(f"cannot list inputs: {exc}") from None
        raise Unavailable(f"cannot list inputs: {exc}") from None


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
    p.add_argument("--expires-in", metavar="DUR")
    p.add_argument("--inputs", metavar="s3://BUCKET/PREFIX")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--queue", metavar="Q", help="the queue (default: default)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--run-at", metavar="TIMESTAMP",
                      help="not before this RFC 3339 time (2026-11-23T18:00:00Z)")
    when.add_argument("--delay", metavar="DUR", help="not before this ISO 8601 duration "
                      "from now (PT10M)")
    return p


def specs_from_args(argv: list[str]) -> list[JobSpec]:
    args = parser().parse_args(argv)
    flags = {
        "resource": args.resource, "max_attempts": args.max_attempts,
        "priority": args.priority, "after": args.after or None,
        "idempotency_key": args.idempotency_key, "ttl": args.ttl, "timeout": args.timeout,
        "expires_in": args.expires_in, "inputs": args.inputs, "queue": args.queue,
        "run_at": args.run_at, "delay": args.delay,
    }
    if args.spec:
        if args.actions or any(v is not None for v in flags.values()) or args.label:
            raise InvalidSpec("give either --spec or ACTION arguments with flags, not both")
        source = "stdin" if args.spec == "-" else args.spec
        try:
            if args.spec == "-":
                data = sys.stdin.buffer.read(MAX_SPEC_BYTES + 1)
            else:
                with open(args.spec, "rb") as f:
                    data = f.read(MAX_SPEC_BYTES + 1)
        except OSError as exc:
            raise InvalidSpec(f"cannot read spec {source!r}: {exc.strerror}") from None
        return parse_spec_text(decode_spec_bytes(data, source), source)
    if not args.actions:
        raise InvalidSpec("nothing to enqueue: give ACTION arguments or --spec FILE")
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidSpec(f"--label {item[:80]!r}: expected KEY=VALUE")
        labels[key] = value
    spec = {k: v for k, v in flags.items() if v is not None}
    spec["actions"] = [parse_action_arg(a) for a in args.actions]
    if labels:
        spec["labels"] = labels
    return parse_specs(spec)


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        specs = specs_from_args(list(sys.argv[1:] if argv is None else argv))
        settings = cli.setup("enqueue")
        with cli.open_store(settings, "enqueue") as store:
            report = run_once(settings, store, specs)
        outs: list[dict[str, object]] = []
        for job in report.jobs:
            out: dict[str, object] = {"job_id": job.job_id, "status": job.status}
            if job.children is not None:
                out["children"] = job.children
            if not job.created:
                out["created"] = False
            outs.append(out)
        cli.emit_lines(outs)
        return 0

    return cli.run_command("enqueue", body)


if __name__ == "__main__":
    sys.exit(main())
