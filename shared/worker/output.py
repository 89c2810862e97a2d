"""A command's whole output, where operators look for it.

Beside the tails kept in the database (``jobfence.actions.child.ChildOutput``), a
worker passes each line a job's ``command`` writes on to its own log, and the whole of
each stream to S3:

- **the worker's log**: one JSON line per line of output, with the job, the attempt
  (number and id), the action and the stream, so that the cluster's log shipping keeps
  them beside the worker's own lines. A worker writes at most
  ``JOBFENCE_OUTPUT_LINES_PER_SECOND`` of them a second, all its jobs together
  (``LineBudget``): past it, lines are dropped and one ``output_lines_dropped`` line a
  second says how many. A line longer than ``LINE_BYTES`` is written in pieces.
- **S3**, when a bucket is configured: each stream in objects of at most ``CHUNK_BYTES``,
  ``JOB/logs/ATTEMPT/ACTION/STREAM/SEQUENCE`` under the installation's prefix (beside the
  job's outputs, never among them: an output may have any name), registered under the
  fence before the first is written (``worker_register_log``): an attempt that lost its
  fence writes none. A stream that stays within a tail's worth and ends within
  ``FLUSH_SECONDS`` never goes there (its tail is whole); one that runs longer is written
  every ``FLUSH_SECONDS``, so that ``jobfence logs --follow`` sees it come. Past
  ``JOBFENCE_OUTPUT_MAX_BYTES`` a stream is cut (``output_truncated``); an object that
  cannot be written ends that stream's upload (``output_upload_error``), never the job.

Memory stays flat whatever a command writes: a chunk per stream at most.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from jobfence.actions.child import STREAMS, TAIL_BYTES, ChildOutput
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectStore, ObjectStoreError, log_key

log = get_logger("jobfence.output")

CHUNK_BYTES = 4 * 1024 * 1024
"""The most of one stream held before it is written to S3 (one object)."""
FLUSH_SECONDS = 5.0
"""How long a stream's output waits at most before it is written to S3, once its action
has run this long."""
LINE_BYTES = 16 * 1024
"""The longest line written to the worker's log in one piece."""


def _pieces(line: bytes, *, whole: bool) -> list[tuple[bytes, bool]]:
    """A line as the worker's log says it: whole, or in pieces of LINE_BYTES each marked
    cut (an unfinished line always in pieces: its last may still wait for more)."""
    if whole and len(line) <= LINE_BYTES:
        return [(line, False)]
    return [(line[i:i + LINE_BYTES], True) for i in range(0, len(line), LINE_BYTES)]


class LineBudget:
    """How many output lines the worker may still write to its log this second (all its
    jobs together); what was dropped is said once a second."""

    def __init__(self, per_second: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.clock = clock
        self._lock = threading.Lock()
        self._second = int(clock())
        self._used = 0
        self._dropped: dict[str, int] = {}

    def take(self, job_id: str, lines: int) -> int:
        """How many of ``lines`` more lines of ``job_id`` may be written now (the first
        ones); the rest are counted as dropped."""
        with self._lock:
            self._roll()
            allowed = max(0, min(lines, int(self.per_second) - self._used))
            self._used += allowed
            if allowed < lines:
                self._dropped[job_id] = self._dropped.get(job_id, 0) + lines - allowed
            return allowed

    def flush(self) -> None:
        """Say now what was dropped (a job's last second)."""
        with self._lock:
            self._say()

    def _roll(self) -> None:
        second = int(self.clock())
        if second != self._second:
            self._second, self._used = second, 0
            self._say()

    def _say(self) -> None:
        for job_id, count in self._dropped.items():
            log.warning("output_lines_dropped", job_id=job_id, lines=count,
                        per_second=self.per_second)
        self._dropped.clear()


@dataclass(frozen=True, slots=True)
class LogTarget:
    """Where one attempt's output goes on S3, and how it is registered under the fence."""

    objects: Callable[[], ObjectStore]
    bucket: str
    installation: str
    max_bytes: int
    register: Callable[[int], bool]
    """Register action INDEX's streams under the fence; False once the fence is lost."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Whose output it is: what each of its log lines says."""

    job_id: UUID
    attempt_id: UUID
    attempt: int
    action_index: int


class _Stream:
    """One stream's way to S3: what waits to be written, what was."""

    def __init__(self, name: str, started: float) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.line = bytearray()   # the line being assembled for the worker's log
        self.continued = False    # whether its beginning was said already, in pieces
        self.waiting = bytearray()  # what waits to go to S3
        self.sent = 0             # bytes written to S3 or given up on (past the cap)
        self.objects = 0
        self.last_write = started
        self.truncated = False
        self.error: str | None = None


class Output(ChildOutput):
    """A command's output: tails, the worker's log and S3 (see the module's docstring)."""

    def __init__(self, origin: Origin, *, lines: LineBudget | None,
                 target: LogTarget | None, touch: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(touch, clock)
        self.origin = origin
        self.lines = lines if lines is not None and lines.per_second > 0 else None
        self.target = target if target is not None and target.max_bytes > 0 else None
        self._streams = {short: _Stream(name, self.started) for short, name in STREAMS.items()}
        self._registered: bool | None = None
        self._register_lock = threading.Lock()

    # -- as the child writes ---------------------------------------------------------------

    def add(self, stream: str, chunk: bytes) -> None:
        super().add(stream, chunk)
        s = self._streams[stream]
        if self.lines is not None:
            self._log_lines(s, chunk)
        if self.target is not None:
            with s.lock:
                room = self.target.max_bytes - s.sent - len(s.waiting)
                if room < len(chunk):
                    s.truncated = True
                s.waiting += chunk[:max(0, room)]
                if len(s.waiting) >= CHUNK_BYTES or self._due(s):
                    self._write(s)

    def tick(self) -> None:
        if self.target is None:
            return
        for s in self._streams.values():
            if s.waiting and self._due(s) and s.lock.acquire(blocking=False):
                try:
                    if s.waiting and self._due(s):
                        self._write(s)
                finally:
                    s.lock.release()

    def close(self) -> None:
        for s in self._streams.values():
            with s.lock:
                if self.lines is not None and s.line:
                    if self.lines.take(str(self.origin.job_id), 1):
                        self._say(s.name, [(bytes(s.line), s.continued)])
                    s.line.clear()
                if self.target is not None and s.waiting and (
                        s.objects or self._total() > TAIL_BYTES or self._due(s)):
                    self._write(s)
        if self.lines is not None:
            self.lines.flush()

    def result(self) -> dict[str, Any]:
        out = super().result()
        if any(s.objects for s in self._streams.values()):
            out["output_on_s3"] = True
        truncated = [s.name for s in self._streams.values() if s.truncated]
        if truncated:
            out["output_truncated"] = truncated
        errors = {s.name: s.error for s in self._streams.values() if s.error}
        if errors:
            out["output_upload_error"] = errors
        return out

    # -- the worker's log --------------------------------------------------------------------

    def _log_lines(self, s: _Stream, chunk: bytes) -> None:
        """The whole lines ``chunk`` ends, each said once (a line longer than LINE_BYTES in
        pieces) while the budget lasts, the rest only counted; what is left waits for the
        rest of its line. What the budget drops is never looked at line by line."""
        assert self.lines is not None
        data = bytes(s.line) + chunk if s.line else chunk
        end = data.rfind(b"\n")
        lines: list[tuple[bytes, bool]] = []
        if end >= 0:
            whole, rest = data[:end], data[end + 1:]
            allowed = self.lines.take(str(self.origin.job_id), whole.count(b"\n") + 1)
            for part in whole.split(b"\n", allowed)[:allowed]:
                lines += _pieces(part, whole=True)
                if s.continued:  # the end of a line whose beginning was said in pieces
                    lines[-1] = (lines[-1][0], True)
                s.continued = False
            s.continued = False
        else:
            rest = data
        pieces = _pieces(rest, whole=False)
        waiting = pieces.pop()[0] if pieces and len(pieces[-1][0]) < LINE_BYTES else b""
        s.line = bytearray(waiting)
        if pieces:
            s.continued = True
            lines += pieces[:self.lines.take(str(self.origin.job_id), len(pieces))]
        if lines:
            self._say(s.name, lines)

    def _say(self, stream: str, lines: list[tuple[bytes, bool]]) -> None:
        o = self.origin
        for line, cut in lines:
            text = line.removesuffix(b"\r").decode("utf-8", errors="replace")
            log.info("output", job_id=str(o.job_id), attempt=o.attempt,
                     attempt_id=str(o.attempt_id), action=o.action_index, stream=stream,
                     line=text, **({"cut": True} if cut else {}))

    # -- S3 -------------------------------------------------------------------------------------

    def _total(self) -> int:
        return sum(self.sizes.values())

    def _due(self, s: _Stream) -> bool:
        now = self.clock()
        return now - self.started >= FLUSH_SECONDS and now - s.last_write >= FLUSH_SECONDS

    def _write(self, s: _Stream) -> None:
        """Write what waits as the stream's next object (under its lock)."""
        t = self.target
        assert t is not None
        s.last_write = self.clock()
        data, s.waiting = bytes(s.waiting), bytearray()
        if s.error is not None or not data or not self._register():
            return
        o = self.origin
        key = log_key(t.installation, o.job_id, o.attempt_id, o.action_index, s.name,
                      sequence=s.objects + 1)
        try:
            t.objects().put_bytes(t.bucket, key, data)
        except ObjectStoreError as exc:
            s.error = str(exc)[:500]
            log.error("output_upload_failed", job_id=str(o.job_id), stream=s.name,
                      key=key, error=s.error)
            return
        s.objects += 1
        s.sent += len(data)
        self.touch()  # the command waited on this write: it was not idle meanwhile

    def _register(self) -> bool:
        """Registered under the fence before the first object (once for both streams)."""
        with self._register_lock:
            if self._registered is None:
                assert self.target is not None
                try:
                    self._registered = self.target.register(self.origin.action_index)
                except Exception as exc:  # the job goes on; its log does not
                    log.warning("output_not_registered", job_id=str(self.origin.job_id),
                                error=str(exc))
                    self._registered = False
                if not self._registered:
                    log.warning("output_not_streamed", job_id=str(self.origin.job_id),
                                message="the attempt's output is not written to S3")
            return self._registered
