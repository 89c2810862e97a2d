"""The command sidecar's protocol: a job's ``command`` child in a second container of the
worker's pod.

The worker holds the database URL; a job's own code must not reach it (invariant 9). On
Kubernetes the shipped worker pod therefore runs ``jobfence command-runner`` as a native
sidecar: a container with no Secret, no configuration, no API token, its own PID namespace
and its own uid, sharing with the worker only a directory that the worker alone may write
(``jobfence.worker.sidecar.link``), in which the worker listens. The runner
(``jobfence.worker.sidecar.serve``) starts each child, keeps each job's space, and streams back
the child's output and the job's files.

**Who talks to whom.** The worker listens; the runner dials in once, when it starts —
before any child of it exists — and keeps that one *control connection*. The worker accepts
exactly one runner connection in its life (from the uid it expects, ``SO_PEERCRED``), then
closes its listening socket and removes its name: from then on there is nothing a child
could connect to, rename or replace. When the control connection closes, the runner's
container has ended, and with it (its own PID namespace) every child it ever started; the
worker starts no more commands and claims no more jobs.

**Channels.** Every request gets a channel of its own: the worker makes a socket pair and
passes one end over the control connection (``{"channel": 1}`` with the descriptor,
``SCM_RIGHTS``). On a channel, JSON objects, one per line; a message that carries
descriptors says how many (``"fds": N``) and they travel with its first byte. The first
message is the request:

- ``{"open": {"attempt": ID}}`` → ``{"space": {"workdir", "inputs", "outputs", "uid"}}``:
  the runner makes the attempt's space (``jobfence.worker.jobspace``) under its own scratch
  directory, owned by the children's user;
- ``{"inputs": {"attempt", "paths": [...]}}`` → ``{"created": N}`` with N descriptors of
  new files under ``inputs/``, open for writing: the worker downloads into them;
- ``{"outputs": {"attempt"}}`` → ``{"listed": [{"path", "size", "dev", "ino"}, ...]}``
  (as many as needed), then ``{"refused": [{"path", "why"}], "done": true}``;
- ``{"open_outputs": {"attempt", "items": [...]}}`` → ``{"opened": [null | WHY, ...]}``
  with one descriptor per ``null``, open for reading: the worker uploads from them;
- ``{"read": {"attempt", "name", "limit"}}`` → ``{"read": B64 | null}``: what the job's
  children left in the file ``name`` at the top of their working directory (a regular file
  of the job's, at most ``limit`` bytes, at most MAX_READ_BYTES), null when there is none;
- ``{"close": {"attempt"}}`` → ``{"closed": true}``: the job's processes killed, its space
  removed;
- ``{"start": {"attempt", "argv", "env"}}`` → ``{"started": PID}`` or ``{"error": ...}``,
  then ``{"out": B64}`` and ``{"err": B64}`` as the child writes, and ``{"exit": CODE,
  "usage": {"cpu_seconds", "peak_memory_bytes"}}`` once the child, its group and every
  descendant are gone and its output is all sent (no ``usage`` where it is unknown). The
  worker may send ``{"kill": true}`` at any time. The channel lives as long as the child:
  when the worker goes away (SIGKILL, a lost fence, an evicted pod) the runner sees it
  close and kills the child's group and every process the child left behind (the runner
  is their subreaper).

Any request may be answered ``{"error": WHY}``. An ``exit`` or an ``error`` also carries
``"faults": {GUARD: N}`` when the runner's own guards noted faults since its last such
answer (``jobfence.worker.faults``): the worker counts them with its own. The sidecar serves
each channel on a thread of its own: a worker running many jobs has as many children there.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""One line of the protocol at most: a start message carries argv and env (at most 1 MiB,
up to six bytes each once JSON-escaped)."""

MAX_FDS = 64
"""Descriptors per message (and so files per inputs or open_outputs request)."""

LISTED_PER_MESSAGE = 1000

CONNECT_SECONDS = 10.0
"""How long a worker waits for the runner to dial in (the sidecar starts first, but a
restarted one takes a moment)."""

FIRST_MESSAGE_SECONDS = 10.0
"""How long the runner waits for a channel's first message before it drops it."""

CLOSE_SECONDS = 5.0
"""How long a worker waits for the runner to confirm that a killed child is gone; a runner
that does not is lost (a child may have stopped it: it shares the runner's uid in the pod)."""

STARTED_SECONDS = 10.0
"""How long a worker waits for the runner to say that a child started; a runner that does
not is lost."""

REPLY_SECONDS = 60.0
"""How long a worker waits for the runner's answer to a request (listing many outputs takes
longest); a runner that does not answer is lost."""

MAX_READ_BYTES = 4096
"""The most a ``read`` request may ask for: a note, never a file's worth."""

REQUESTS = ("open", "inputs", "outputs", "open_outputs", "read", "close", "start")


class ProtocolError(Exception):
    """A message that is not the protocol's."""


class Channel:
    """JSON lines, with descriptors, over a stream socket; ``send`` may be called from any
    thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._fds: list[int] = []
        self._lock = threading.Lock()

    def send(self, fds: Sequence[int] = (), **message: Any) -> None:
        if fds:
            message["fds"] = len(fds)
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            if not fds:
                self.sock.sendall(data)
                return
            sent = socket.send_fds(self.sock, [data], list(fds))
            if sent < len(data):
                self.sock.sendall(data[sent:])

    def _fill(self) -> bool:
        """Read what is there; False once the peer has closed."""
        chunk, fds, flags, _ = socket.recv_fds(self.sock, 65536, MAX_FDS,
                                              socket.MSG_CMSG_CLOEXEC)
        self._fds.extend(fds)
        if flags & socket.MSG_CTRUNC:
            raise ProtocolError("more descriptors than a message may carry")
        if not chunk:
            return False
        self._buffer += chunk
        return True

    def receive_with_fds(self) -> tuple[dict[str, Any], list[int]] | None:
        """The next message and the descriptors it carries; None once the peer has closed.
        ProtocolError on anything else than a JSON object on a line of at most
        MAX_MESSAGE_BYTES; OSError (a timeout included) as raised."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"a message longer than {MAX_MESSAGE_BYTES} bytes")
            if not self._fill():
                if self._buffer:
                    raise ProtocolError("the connection closed inside a message")
                return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"a message longer than {MAX_MESSAGE_BYTES} bytes")
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            raise ProtocolError("a message that is not JSON") from None
        if not isinstance(message, dict):
            raise ProtocolError("a message that is not a JSON object")
        count = message.pop("fds", 0)
        if not isinstance(count, int) or not 0 <= count <= len(self._fds):
            raise ProtocolError("a message announcing descriptors it does not carry")
        fds, self._fds = self._fds[:count], self._fds[count:]
        return message, fds

    def receive(self) -> dict[str, Any] | None:
        """The next message, which must carry no descriptor."""
        got = self.receive_with_fds()
        if got is None:
            return None
        message, fds = got
        if fds:
            close_all(fds)
            raise ProtocolError("a message with descriptors where none belong")
        return message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        close_all(self._fds)
        self._fds = []


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# -- requests, checked -------------------------------------------------------------------


def parse_request(message: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A channel's first message, checked: its kind and its arguments; ProtocolError says
    what is wrong."""
    if len(message) != 1 or next(iter(message)) not in REQUESTS:
        raise ProtocolError(f"the first message must be one of {', '.join(REQUESTS)}")
    kind, args = next(iter(message.items()))
    if not isinstance(args, dict):
        raise ProtocolError(f"{kind}: its arguments must be an object")
    attempt = args.get("attempt")
    try:
        UUID(str(attempt))
    except ValueError:
        raise ProtocolError(f"{kind}: attempt must be an attempt id") from None
    check = {"start": _start, "inputs": _inputs, "open_outputs": _items,
             "read": _read}.get(kind)
    expected = {"start": {"attempt", "argv", "env"}, "inputs": {"attempt", "paths"},
                "open_outputs": {"attempt", "items"},
                "read": {"attempt", "name", "limit"}}.get(kind, {"attempt"})
    if set(args) != expected:
        raise ProtocolError(f'{kind}: its arguments must be {", ".join(sorted(expected))}')
    if check is not None:
        check(args)
    return kind, args


def _text(value: object) -> bool:
    return isinstance(value, str) and "\0" not in value


def _start(args: Mapping[str, Any]) -> None:
    argv, env = args["argv"], args["env"]
    if not (isinstance(argv, list) and argv and all(_text(a) for a in argv) and argv[0]):
        raise ProtocolError("argv must be a non-empty list of strings without NUL, "
                            "argv[0] not empty")
    if not (isinstance(env, dict) and all(
            _text(k) and k and "=" not in k and _text(v) for k, v in env.items())):
        raise ProtocolError("env must map names (non-empty, without '=' or NUL) to strings "
                            "without NUL")


def _inputs(args: Mapping[str, Any]) -> None:
    paths = args["paths"]
    if not (isinstance(paths, list) and len(paths) <= MAX_FDS
            and all(_text(p) and p for p in paths)):
        raise ProtocolError(f"paths must be at most {MAX_FDS} non-empty strings")


def _items(args: Mapping[str, Any]) -> None:
    items = args["items"]
    if not (isinstance(items, list) and len(items) <= MAX_FDS and all(
            isinstance(i, dict) and set(i) == {"path", "size", "dev", "ino"}
            and _text(i["path"]) and all(isinstance(i[k], int) for k in ("size", "dev", "ino"))
            for i in items)):
        raise ProtocolError(f"items must be at most {MAX_FDS} listed files")


def _read(args: Mapping[str, Any]) -> None:
    name, limit = args["name"], args["limit"]
    if not (_text(name) and name not in ("", ".", "..") and "/" not in name):
        raise ProtocolError("name must be a file name (not empty, no '/')")
    if not (type(limit) is int and 1 <= limit <= MAX_READ_BYTES):
        raise ProtocolError(f"limit must be a whole number from 1 to {MAX_READ_BYTES}")


def read_reply(reply: Mapping[str, Any], limit: int) -> bytes | None:
    """The bytes a ``read`` reply carries (None: no such file); ProtocolError when it is
    not a read reply of at most ``limit`` bytes."""
    got = reply.get("read", 0)
    if got is None and "read" in reply:
        return None
    try:
        data = base64.b64decode(got, validate=True) if isinstance(got, str) else None
    except ValueError:
        data = None
    if data is None or len(data) > limit:
        raise ProtocolError(f"not a read reply of at most {limit} bytes")
    return data
