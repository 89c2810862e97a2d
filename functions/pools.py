"""pools: render the KEDA ScaledJob of every worker pool declared in a pools file
(``manifests/pools.yaml``): ``jobfence pools render FILE > manifests/pools.generated.yaml``
(``make pools``). Needs no database: the trigger queries are the product's own statement
with each pool's queue filled in."""

from __future__ import annotations

import sys

from jobfence import cli
from jobfence.errors import InvalidSpec
from jobfence.pools import Pools, scaled_job, template
from jobfence.store.queues import scaler_query

HEADER = """\
# Written by `jobfence pools render` from pools.yaml: edit that file, then `make pools`.
# One KEDA ScaledJob per pool. Its trigger counts only its queue: ready work plus the
# queue's live claims, capped at the queue's limit, 0 while drain mode is on or the queue
# is paused. KEDA's default scaling strategy starts min(maxReplicaCount,
# ceil(value / targetQueryValue)) Jobs minus the pool's Jobs still running, and a pool's
# targetQueryValue is its concurrency C (the jobs one pod runs at once). With R ready jobs,
# P running pods and L live claims (L <= P * C): new pods = ceil((R + L) / C) - P.
# - One job per pod (C = 1): each running pod holds one claim (L = P), so one new pod per
#   ready job.
# - A draining pool: while its pods are full (L = P * C) that is ceil(R / C) new pods, each
#   taking C ready jobs at once; pods with free slots (L < P * C) claim ready work
#   themselves at their next terminal write or look, and count for less than a pod. Once
#   nothing is ready the value is the pods' own claims, ceil(L / C) <= P: no pod more is
#   started, and each pod exits when it finds nothing to claim (or its budget is spent).
"""


def render(text: str) -> str:
    import yaml
    from pydantic import ValidationError

    try:
        pools = Pools.model_validate(yaml.safe_load(text))
    except (ValidationError, yaml.YAMLError) as exc:
        raise InvalidSpec(f"pools file: {' '.join(str(exc).split())}") from None
    base = template()
    docs = [scaled_job(p, scaler_query(pools.schema_name, p.queue), base)
            for p in pools.pools]
    return HEADER + "---\n".join(yaml.safe_dump(d, sort_keys=False, width=100) for d in docs)


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence pools", description=__doc__)
        sub = p.add_subparsers(dest="verb", required=True, metavar="render")
        r = sub.add_parser("render", help="print the ScaledJobs of a pools file")
        r.add_argument("file", help="the pools file (- for stdin)")
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        try:
            text = sys.stdin.read() if args.file == "-" else open(  # noqa: SIM115
                args.file, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidSpec(f"cannot read {args.file!r}: {exc}") from None
        sys.stdout.write(render(text))
        return 0

    return cli.run_command("pools", body)


if __name__ == "__main__":
    sys.exit(main())
