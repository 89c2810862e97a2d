"""A ``command`` asks to run again later: it writes the delay into the file that
``JOBFENCE_SNOOZE_FILE`` names and exits with ``EXIT_CODE`` (75, ``EX_TEMPFAIL`` of
sysexits.h: "try again later"). The action then raises ``Snooze`` as a plugin's action would
(``jobfence.actions``), and the worker gives the job back without spending an attempt.

The file is the job's own code's, so it is read as anything of the job's is: through the
space's descriptors (``JobSpace.read_file``: a regular file of the job's, never through a
link, at most ``MAX_FILE_BYTES``), and its content is parsed strictly. Whatever is wrong
with it — no file, a link, a FIFO, a longer file, not a delay, a delay out of bounds — the
command's exit is an ordinary failure whose error says what was wrong.

Each action of an attempt has a file name of its own (``.jobfence-snooze-<index>``, in the
command's working directory), so that what an earlier command of the attempt left there is
never taken for a later one's request.
"""

from __future__ import annotations

import re
from datetime import timedelta

from jobfence.actions import MAX_SNOOZE, MIN_SNOOZE, Snooze
from jobfence.actions.child import ChildLost, ChildNotStarted, JobSpace, SpacePaths
from jobfence.durations import format_duration, parse_duration
from jobfence.fsboundary import BoundaryError

EXIT_CODE = 75
"""EX_TEMPFAIL: what a command exits with to snooze."""

ENV = "JOBFENCE_SNOOZE_FILE"
MAX_FILE_BYTES = 100
"""A delay is a few characters; nothing longer is read."""

_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{0,9})?|\.[0-9]{1,9}")


def file_name(action_index: int) -> str:
    return f".jobfence-snooze-{action_index}"


def env(paths: SpacePaths, action_index: int) -> dict[str, str]:
    """The variable that tells a command where to write its delay."""
    return {ENV: f"{paths.workdir}/{file_name(action_index)}"}


def parse_delay(data: bytes) -> timedelta:
    """The delay a snooze file holds: seconds (``90``, ``2.5``) or an ISO 8601 duration
    (``PT90S``, ``PT1H``), surrounding white space allowed, from a millisecond to a day;
    ValueError saying what is wrong (never echoing more than a few bytes of it)."""
    shown = repr(data[:40])
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{shown} is not a delay (not ASCII text)") from None
    if _SECONDS.fullmatch(text):
        delay = timedelta(seconds=float(text))
    elif text[:1] in ("P", "p"):
        try:
            delay = parse_duration(text)
        except ValueError:
            raise ValueError(f"{shown} is not an ISO 8601 duration (e.g. PT90S)") from None
    else:
        raise ValueError(f"{shown} is not a delay: give seconds (e.g. 90) or an ISO 8601 "
                         "duration (e.g. PT90S)")
    if not MIN_SNOOZE <= delay <= MAX_SNOOZE:
        raise ValueError(f"a snooze lasts from a millisecond to {format_duration(MAX_SNOOZE)}, "
                         f"not {format_duration(delay) if delay else '0'}")
    return delay


def asked(space: JobSpace, action_index: int) -> str:
    """The command exited with ``EXIT_CODE``: raise the ``Snooze`` its file asks for, or
    return why there is none to raise (its action then fails with that)."""
    try:
        data = space.read_file(file_name(action_index), MAX_FILE_BYTES)
    except (BoundaryError, ChildNotStarted, ChildLost) as exc:
        return f"its snooze file was refused: {exc}"
    if data is None:
        return f"it wrote no delay into ${ENV}"
    try:
        delay = parse_delay(data)
    except ValueError as exc:
        return f"its snooze file says no delay: {exc}"
    raise Snooze(delay)
