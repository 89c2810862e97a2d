"""A job's output, read back: what ``jobfence logs``, the API and the console show.

Each action of an attempt left either its whole stdout and stderr on S3 (registered in
``job_logs``, written by ``jobfence.worker.output``) or only their tails in its result —
then whole when the result's ``stdout_bytes``/``stderr_bytes`` say the tail held it all.
``Logs.pieces`` says which, action by action; ``Logs.read`` yields a piece's bytes, an
object at a time (memory stays flat whatever the size), from a given object on (what
``--follow`` has not printed yet). Where to look on S3 follows from the job, the attempt
and the action (``jobfence.objectstore.log_prefix``): nothing a worker wrote names it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from jobfence.actions.child import STREAMS
from jobfence.errors import InvalidSpec, JobNotFound, NotFound
from jobfence.objectstore import ObjectStore, log_prefix
from jobfence.store import Store
from jobfence.store.types import JobRow
from jobfence.views import attempts_of, harmless

STREAM_NAMES = tuple(STREAMS.values())

def visible(data: bytes) -> bytes:
    """A job's output made safe for a person's terminal (``jobfence.views.harmless``)."""
    return harmless(data.decode("utf-8", errors="replace")).encode()


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job: its number (as ``status`` counts them), id, and whether it
    still runs."""

    number: int
    attempt_id: UUID
    running: bool


@dataclass(frozen=True, slots=True)
class Piece:
    """One stream of one action of an attempt: on S3 whole (``on_s3``), or its tail."""

    action_index: int
    action: str
    stream: str
    on_s3: bool
    size: int | None
    """Bytes the stream held, once its action ended (None while it runs)."""
    tail: str | None = None
    """The tail, where the stream is not on S3."""

    @property
    def whole(self) -> bool:
        """Whether what can be read is the whole stream."""
        if self.on_s3:
            return True
        return self.size is not None and self.tail is not None and \
            len(self.tail.encode()) >= self.size


@dataclass(frozen=True, slots=True)
class Logs:
    """A job's output, from its store and (for what went there) S3."""

    store: Store
    objects: Callable[[], ObjectStore] | None
    bucket: str | None
    installation: str

    def job(self, job_id: UUID) -> JobRow:
        row = self.store.jobs.get(job_id)
        if row is None:
            raise JobNotFound(job_id)
        return row

    def attempt(self, job_id: UUID, number: int | None = None) -> Attempt:
        """Attempt ``number`` as ``status`` numbers them (the latest claim that ran as that
        attempt: one given back by a snooze or a SIGTERM is followed by another of the same
        number, and a retry counts afresh), else the latest; NotFound when there is none."""
        row = self.job(job_id)
        attempts = attempts_of(self.store.jobs.events(job_id))
        if not attempts:
            raise NotFound(f"job {job_id} has not run yet")
        if number is not None:
            numbered = [a for a in attempts if a["number"] == number]
            if not numbered:
                had = sorted({a["number"] for a in attempts})
                raise InvalidSpec(f"job {job_id} has no attempt {number} (its attempts: "
                                  f"{', '.join(str(n) for n in had)})")
            attempts = numbered
        chosen = attempts[-1]
        running = chosen["outcome"] == "running" and row.status == "running"
        attempt_id = chosen["attempt_id"] or (row.attempt_id if running else None)
        if attempt_id is None:
            raise NotFound(f"attempt {chosen['number']} of job {job_id} left no output")
        return Attempt(chosen["number"], attempt_id, running)

    def still_running(self, job_id: UUID, attempt: Attempt) -> bool:
        row = self.job(job_id)
        return row.status == "running" and row.attempt_id == attempt.attempt_id

    def pieces(self, job_id: UUID, attempt: Attempt) -> list[Piece]:
        """Each stream of each action the attempt started, in order."""
        row = self.job(job_id)
        results: dict[int, Any] = {
            r.action_index: r for r in self.store.jobs.action_results([job_id])
            if r.attempt_id == attempt.attempt_id}
        logged = set(self.store.jobs.logged_actions(job_id, attempt.attempt_id))
        out: list[Piece] = []
        for index in sorted(set(results) | logged):
            name = row.actions[index]["name"] if index < len(row.actions) else "?"
            result = results[index].result if index in results else None
            result = result if isinstance(result, dict) else {}
            for stream in STREAM_NAMES:
                size = result.get(f"{stream}_bytes")
                size = size if isinstance(size, int) else None
                if index in logged:
                    out.append(Piece(index, name, stream, True, size))
                elif f"{stream}_tail" in result:
                    out.append(Piece(index, name, stream, False, size,
                                     str(result[f"{stream}_tail"])))
        return out

    def read(self, job_id: UUID, attempt: Attempt, piece: Piece,
             after: int = 0) -> Iterator[tuple[int, bytes]]:
        """The piece's bytes, an object at a time, each with its sequence number (from 1),
        from the one after ``after`` on. A tail is one piece numbered 1."""
        if not piece.on_s3:
            if after < 1 and piece.tail is not None:
                yield 1, piece.tail.encode()
            return
        if self.objects is None or not self.bucket:
            raise NotFound("the whole output is on S3, and no bucket is configured here "
                           "(JOBFENCE_S3_BUCKET)")
        store = self.objects()
        prefix = log_prefix(self.installation, job_id, attempt.attempt_id,
                            piece.action_index, piece.stream)
        for info in store.iter_objects(self.bucket, prefix):
            name = info.key[len(prefix):]
            if not (len(name) == 8 and name.isdigit()) or int(name) <= after:
                continue
            yield int(name), store.get_bytes(self.bucket, info.key)
