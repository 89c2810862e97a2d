"""Retry or cancel a selection of jobs, for the CLI (``jobfence retry|cancel --status ...``)
and the API (``POST /api/v1/jobs/retry|cancel``): the filters ``list`` has, a window of
creation time, or explicit job ids.

A selection is fixed when it begins: only jobs made by then (the database's clock), newest
first, at most ``limit`` of them. It is walked a batch at a
time (``JOBFENCE_BATCH_SIZE``, at most 1,000), and each batch is one transaction of the
database's own ``operator_retry_many`` / ``operator_cancel_many`` — the rules of the
one-job commands, job by job, audited with the caller in each job's trail — so no
transaction is longer than a batch, and a selection of millions never holds a lock for
long. A dry run reads the same pages and writes nothing.

The command line's side, which ``jobfence retry`` and ``jobfence cancel`` share, is here
too: their arguments, a job id alone or a selection, and the selection acted on with a
prompt past ``--limit`` and a report (``parser``, ``one_job``, ``act_on_selection``).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from jobfence import cli
from jobfence.durations import parse_duration
from jobfence.errors import ExitCode, InvalidSpec
from jobfence.limits import MAX_DURATION
from jobfence.spec import RFC3339
from jobfence.store import Store
from jobfence.store.jobs import Selected

VERBS: dict[str, tuple[str, ...]] = {
    "retry": ("failed", "cancelled"),
    "cancel": ("waiting", "pending", "running"),
}
"""The statuses each verb can act on."""

MAX_LIMIT = 1_000_000
MAX_BATCH = 1_000
MAX_SETTLED = 100_000
"""Retried jobs waiting on dependencies that a bulk retry settles itself when it ends (its
memory stays bounded); export-finalize's next pass settles any beyond."""
DONE = {"retry": "retried", "cancel": "cancelled"}


def parse_time(text: str, what: str) -> datetime:
    """An RFC 3339 timestamp, or an ISO 8601 duration meaning that long ago (``PT12H``)."""
    text = text.strip()
    if RFC3339.fullmatch(text):
        try:
            value = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            raise InvalidSpec(f"{what} {text[:60]!r}: not a valid time") from None
        now = datetime.now(UTC)
        if not now - MAX_DURATION <= value <= now + MAX_DURATION:
            raise InvalidSpec(f"{what} {text[:60]!r}: must be within 100 years of now")
        return value
    if text.startswith("P"):
        try:
            ago = parse_duration(text)
        except ValueError as exc:
            raise InvalidSpec(f"{what} {text[:60]!r}: {exc}") from None
        return datetime.now(UTC) - ago
    raise InvalidSpec(f"{what} {text[:60]!r}: give an RFC 3339 time "
                      "(2026-11-24T18:00:00Z) or an ISO 8601 duration ago (PT12H)")


@dataclass(frozen=True)
class Selection:
    """Which jobs a bulk verb acts on: ``job_ids``, or jobs of ``statuses`` that the
    filters select."""

    statuses: tuple[str, ...] = ()
    queue: str | None = None
    resource: str | None = None
    parent_id: UUID | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    created_before: datetime | None = None
    created_after: datetime | None = None
    job_ids: tuple[UUID, ...] = ()

    def check(self, verb: str) -> None:
        """InvalidSpec unless this selection names what ``verb`` can act on."""
        allowed = VERBS[verb]
        if self.job_ids:
            if self.statuses or self.filters_given():
                raise InvalidSpec("give job ids or filters, not both")
            if len(self.job_ids) > MAX_BATCH:
                raise InvalidSpec(f"at most {MAX_BATCH} job ids in one request (use "
                                  "filters for more)")
            return
        if not self.statuses:
            raise InvalidSpec(f"{verb} in bulk needs --status ({' or '.join(allowed)}), "
                              "or a job id")
        for s in self.statuses:
            if s not in allowed:
                raise InvalidSpec(f"{verb} acts on {' or '.join(allowed)} jobs, not {s!r}")
        if self.created_before and self.created_after \
                and self.created_after >= self.created_before:
            raise InvalidSpec("--after must be earlier than --before")

    def filters_given(self) -> bool:
        return any(v for v in (self.queue, self.resource, self.parent_id, self.labels,
                               self.created_before, self.created_after))

    def filters(self) -> dict[str, Any]:
        return {"queue": self.queue, "resource": self.resource, "parent_id": self.parent_id,
                "labels": dict(self.labels), "created_before": self.created_before,
                "created_after": self.created_after}


def ceiling_now(store: Store) -> datetime:
    """Where a selection's window ends: now, by the database's clock (the clock that stamps
    ``created_at``)."""
    return store.jobs.clock()


def count(store: Store, sel: Selection, *, ceiling: datetime, cap: int) -> int:
    """How many jobs the selection holds (at most ``cap``)."""
    if sel.job_ids:
        return len(sel.job_ids)
    total = 0
    for status in sel.statuses:
        total += store.jobs.select_count(status=status, filters=sel.filters(),
                                         ceiling=ceiling, cap=cap - total)
        if total >= cap:
            break
    return total


def pages(store: Store, sel: Selection, verb: str, *, ceiling: datetime, batch: int,
          limit: int) -> Iterator[list[Selected]]:
    """The selection a page at a time, at most ``limit`` jobs in all."""
    if sel.job_ids:
        found = {s.job_id: s for s in store.jobs.statuses_of(sel.job_ids)}
        yield [found.get(i) or Selected(i, "", "") for i in sel.job_ids][:limit]
        return
    left = limit
    for status in sel.statuses:
        after: UUID | None = None
        while left > 0:
            page = store.jobs.select_page(status=status, filters=sel.filters(),
                                          ceiling=ceiling, after=after,
                                          limit=min(batch, left))
            if not page:
                break
            yield page
            left -= len(page)
            after = page[-1].job_id
            if len(page) < min(batch, left + len(page)):
                break


@dataclass
class Outcome:
    """What a bulk verb did: how many it selected, acted on and why it refused others."""

    verb: str
    dry_run: bool
    matched: int = 0
    done: int = 0
    children_cancelled: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    job_ids: list[UUID] = field(default_factory=list)
    """For a dry run: every job it would act on (newest first)."""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verb": self.verb, "dry_run": self.dry_run,
                               "matched": self.matched, DONE[self.verb]: self.done,
                               "refused": dict(self.refused), "batches": self.batches}
        if self.verb == "cancel":
            out["children_cancelled"] = self.children_cancelled
        if self.dry_run:
            out["job_ids"] = [str(j) for j in self.job_ids]
        return out


def act(store: Store, verb: str, sel: Selection, *, reason: str, limit: int, batch: int,
        dry_run: bool = False, ceiling: datetime | None = None,
        on_page: Callable[[list[Selected]], None] | None = None) -> Outcome:
    """Retry or cancel (``verb``) at most ``limit`` jobs of ``sel``, a transaction per
    batch; with ``dry_run``, only read what it would act on."""
    sel.check(verb)
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidSpec(f"limit must be between 1 and {MAX_LIMIT}")
    batch = max(1, min(batch, MAX_BATCH))
    out = Outcome(verb, dry_run)
    waiting: list[UUID] = []  # retried jobs waiting on dependencies: settled at the end
    for page in pages(store, sel, verb, ceiling=ceiling or ceiling_now(store), batch=batch,
                      limit=limit):
        out.matched += len(page)
        out.batches += 1
        if on_page is not None:
            on_page(page)
        if dry_run:
            out.job_ids += [p.job_id for p in page if p.status in VERBS[verb]]
            continue
        ids = [p.job_id for p in page]
        if verb == "retry":
            for a in store.jobs.retry_many(job_ids=ids, reason=reason):
                if a.refusal is None:
                    out.done += 1
                    if a.status == "waiting" and len(waiting) < MAX_SETTLED:
                        waiting.append(a.job_id)
                else:
                    out.refused[a.refusal] += 1
        else:
            done, refused = store.jobs.cancel_many(job_ids=ids, reason=reason)
            asked = set(ids)
            out.done += sum(1 for t in done if t.job_id in asked)
            out.children_cancelled += sum(1 for t in done if t.job_id not in asked)
            for a in refused:
                out.refused[a.refusal or ""] += 1
    # Once the whole selection is retried: a dependency retried in a later batch than its
    # dependent is then waited for, not taken as failed.
    for i in range(0, len(waiting), MAX_BATCH):
        store.jobs.settle_retried(waiting[i:i + MAX_BATCH])
    return out


def said_by(verb: str, who: str, reason: str | None) -> str:
    """The reason recorded in each job's audit trail: what, by whom, why."""
    said = f": {reason[:2000]}" if reason else ""
    return f"{DONE[verb]} by {who} (bulk){said}"



# ---- the command line: `jobfence retry|cancel` (functions/retry.py, functions/cancel.py) ----

DEFAULT_LIMIT = 1000
"""How many jobs ``jobfence retry|cancel`` acts on without asking (``--limit``)."""

FILTERS = ("status", "queue", "label", "resource", "parent", "before", "after")


def parser(verb: str, what: str) -> cli.Parser:
    """``jobfence VERB``'s arguments: one job by its id, or the filters of a selection;
    ``what`` says what the verb does to a job."""
    p = cli.Parser(prog=f"jobfence {verb}", description=f"{what} With filters instead of "
                   "a job id: every job they select, in batches, each audited with who "
                   "asked.")
    p.add_argument("job_id", nargs="?", metavar="JOB_ID")
    p.add_argument("--reason", help="why (recorded in each job's audit trail)")
    p.add_argument("--status", action="append", default=[], choices=VERBS[verb],
                   help="jobs in this status (repeat for several)")
    p.add_argument("--queue", metavar="Q")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--resource", metavar="KEY")
    p.add_argument("--parent", metavar="JOB_ID")
    p.add_argument("--before", metavar="TIME", help="made before this RFC 3339 time, or "
                   "this ISO 8601 duration ago (PT12H)")
    p.add_argument("--after", metavar="TIME", help="made at or after this time")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                   help=f"act on at most this many without asking (default {DEFAULT_LIMIT})")
    p.add_argument("--dry-run", action="store_true", help="print what would be touched")
    p.add_argument("--yes", "-y", action="store_true", help="act past --limit without asking")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    return p


def one_job(args: argparse.Namespace) -> UUID:
    """The job id of ``jobfence retry|cancel JOB_ID``; InvalidSpec if filters came with it."""
    a = vars(args)
    given = [k for k in FILTERS if a[k]] + [k for k in ("dry_run", "yes") if a[k]]
    if given:
        raise InvalidSpec(f"give a job id or filters (--{given[0].replace('_', '-')}), "
                          "not both")
    return cli.job_id(args.job_id)


def selection_of(args: argparse.Namespace, verb: str) -> Selection:
    """The selection the filters of ``jobfence VERB`` name (InvalidSpec saying why not)."""
    a = vars(args)
    sel = Selection(
        statuses=tuple(dict.fromkeys(a["status"])),
        queue=cli.queue_of(a["queue"]) if a["queue"] is not None else None,
        resource=a["resource"], parent_id=cli.job_id(a["parent"]) if a["parent"] else None,
        labels=cli.labels_of(a["label"]),
        created_before=parse_time(a["before"], "--before") if a["before"] else None,
        created_after=parse_time(a["after"], "--after") if a["after"] else None)
    sel.check(verb)
    if not 1 <= a["limit"] <= MAX_LIMIT:
        raise InvalidSpec(f"--limit must be between 1 and {MAX_LIMIT}")
    return sel


def act_on_selection(verb: str, args: argparse.Namespace) -> int:
    """``jobfence VERB --status ...``: the selection, a batch per transaction. ``--dry-run``
    prints what would be touched and writes nothing. Past ``--limit`` jobs a terminal asks
    first; elsewhere ``--yes`` says so, or nothing is done."""
    a = vars(args)
    sel = selection_of(args, verb)
    settings = cli.setup(verb)
    text = a["output"] == "text"

    def show(page: list[Selected]) -> None:
        if text and a["dry_run"]:
            sys.stdout.write("".join(f"{p.job_id}  {p.status:<9}  {p.queue}\n" for p in page))

    with cli.open_store(settings, verb) as store:
        ceiling = ceiling_now(store)
        limit = a["limit"]
        if a["dry_run"]:
            limit = MAX_LIMIT
        else:
            matched = count(store, sel, ceiling=ceiling, cap=MAX_LIMIT)
            if matched > limit and not a["yes"]:
                if not (sys.stdin.isatty() and sys.stderr.isatty()):
                    raise InvalidSpec(f"{matched} jobs match, more than --limit {limit}: "
                                      f"pass --yes to {verb} all of them, raise --limit, or "
                                      "narrow the selection (nothing was written)")
                if not _confirmed(verb, matched, limit):
                    cli.error("nothing was done")
                    return int(ExitCode.FAILED)
            limit = max(1, matched)
        out = act(store, verb, sel, reason=said_by(verb, cli.actor(), a["reason"]),
                  limit=limit, batch=settings.batch_size, dry_run=a["dry_run"],
                  ceiling=ceiling, on_page=show)
    if not text:
        cli.emit(out.as_json())
    elif a["dry_run"]:
        print(f"would {verb} {len(out.job_ids)} jobs (dry run: nothing was written)")
    else:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(out.refused.items()))
        extra = (f", {out.children_cancelled} children with them"
                 if out.children_cancelled else "")
        print(f"{DONE[verb]} {out.done} of {out.matched} jobs{extra}"
              + (f" (refused: {refused})" if refused else "")
              + f" in {out.batches} batches")
    return 0


def _confirmed(verb: str, matched: int, limit: int) -> bool:
    """Ask on the terminal whether to act on ``matched`` jobs, past ``limit``."""
    sys.stderr.write(f"{matched} jobs match, more than --limit {limit}. "
                     f"{verb.capitalize()} all {matched}? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")
