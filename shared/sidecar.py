"""The command sidecar: a job's ``command`` child in a second container of the worker's pod.

The worker holds the database URL; a job's own code must not reach it (invariant 9). On
Kubernetes the shipped worker pod therefore runs ``jobfence command-runner`` as a native
sidecar: a container with no Secret, no configuration, no API token and its own PID
namespace, sharing only an ``emptyDir`` with the worker — the attempt directories and this
socket. The worker (``RemoteChild``) asks it to start each command; the runner
(``serve``) starts it as its own child and streams its output back.

The protocol is JSON, one object per line, on one connection per child:

- worker → runner: ``{"start": {"argv": [...], "cwd": "...", "env": {...}}}`` first, then
  ``{"kill": true}`` at any time (SIGKILL the child's process group);
- runner → worker: ``{"started": PID}`` or ``{"error": "cannot start ..."}``, then
  ``{"out": B64}`` and ``{"err": B64}`` as the child writes, and ``{"exit": CODE}`` once the
  child, its group and every descendant are gone and its output is all sent.

The connection's lifetime is the child's: when the worker goes away (SIGKILL, a lost
fence, an evicted pod), the runner sees the connection close and kills the child's group
and every process the child left behind (the runner is their subreaper), as the kernel's
parent-death signal does for a child started by the worker itself.

The runner serves one connection at a time, as a worker runs one action at a time; it
refuses a malformed first message with ``{"error": ...}`` and goes on serving. Its socket
is created mode 0600: where the runner runs as root and starts children as another user
(``JOBFENCE_COMMAND_USER``), they cannot connect to it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobfence.logs import get_logger
from jobfence.proctree import Tail, kill_descendants
from jobfence.sandbox import ChildLost, ChildNotStarted, LocalChild, Sandbox

log = get_logger("jobfence.sidecar")

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""One line of the protocol at most: a start message carries argv and env (at most 1 MiB,
up to six bytes each once JSON-escaped)."""

CONNECT_SECONDS = 10.0
"""How long a worker waits for the runner's socket to answer (the sidecar starts first, but
a restarted one takes a moment)."""

FIRST_MESSAGE_SECONDS = 10.0
"""How long the runner waits for a connection's first message before it drops it."""

CLOSE_SECONDS = 5.0
"""How long a worker waits for the runner to confirm that a killed child is gone."""


class ProtocolError(Exception):
    """A message that is not the protocol's."""


class Channel:
    """JSON lines over a stream socket; ``send`` may be called from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._lock = threading.Lock()

    def send(self, **message: Any) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            self.sock.sendall(data)

    def receive(self) -> dict[str, Any] | None:
        """The next message; None once the peer has closed. ProtocolError on anything else
        than a JSON object on a line of at most MAX_MESSAGE_BYTES; OSError as raised."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"a message longer than {MAX_MESSAGE_BYTES} bytes")
            chunk = self.sock.recv(65536)
            if not chunk:
                if self._buffer:
                    raise ProtocolError("the connection closed inside a message")
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"a message longer than {MAX_MESSAGE_BYTES} bytes")
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            raise ProtocolError("a message that is not JSON") from None
        if not isinstance(message, dict):
            raise ProtocolError("a message that is not a JSON object")
        return message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# -- the worker's side ---------------------------------------------------------------------


class RemoteChild:
    """A job's child running in the command sidecar (the ``Child`` of jobfence.sandbox)."""

    pgid: int | None = None  # not ours to kill: ``kill`` asks the runner

    def __init__(self, channel: Channel, where: Path) -> None:
        self._channel = channel
        self._where = where
        self._tails = {"out": Tail(), "err": Tail()}
        self._code: int | None = None
        self._lost: str | None = None
        self._ended = threading.Event()
        self._reader = threading.Thread(target=self._read, name="sidecar-reader", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, path: Path, argv: Sequence[str], cwd: Path, env: Mapping[str, str],
              connect_seconds: float = CONNECT_SECONDS) -> RemoteChild:
        channel = Channel(_connect(path, connect_seconds))
        try:
            channel.send(start={"argv": list(argv), "cwd": str(cwd), "env": dict(env)})
            reply = channel.receive()
        except (OSError, ProtocolError) as exc:
            channel.close()
            raise ChildNotStarted(f"the command sidecar at {path} failed: {exc}") from exc
        if reply is None or not isinstance(reply.get("started"), int):
            channel.close()
            reason = reply.get("error") if reply else "it closed the connection"
            raise ChildNotStarted(str(reason) if reason else f"the command sidecar at {path} "
                                  f"answered {str(reply)[:200]}")
        return cls(channel, path)

    def _read(self) -> None:
        try:
            while (message := self._channel.receive()) is not None:
                if "exit" in message:
                    self._code = int(message["exit"])
                    return
                for stream in ("out", "err"):
                    if stream in message:
                        self._tails[stream].add(base64.b64decode(message[stream]))
            self._lost = "closed the connection while the command ran"
        except (OSError, ProtocolError, ValueError, TypeError) as exc:
            self._lost = f"failed while the command ran: {exc}"
        finally:
            self._ended.set()

    def wait(self, timeout: float) -> int | None:
        if not self._ended.wait(timeout):
            return None
        if self._lost is not None:
            raise ChildLost(f"the command sidecar at {self._where} {self._lost}")
        return self._code

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self._channel.send(kill=True)

    def close(self) -> None:
        if not self._ended.is_set():
            self.kill()
            self._ended.wait(CLOSE_SECONDS)
        self._channel.close()  # a runner still serving kills what is left when it sees this
        self._reader.join(timeout=1)

    def ended(self) -> bool:
        """Only once the runner said so: it sends the exit after the child's group and every
        descendant are gone."""
        return self._ended.is_set() and self._lost is None

    def output(self) -> tuple[str, str]:
        return self._tails["out"].text(), self._tails["err"].text()


def _connect(path: Path, seconds: float) -> socket.socket:
    deadline = time.monotonic() + seconds
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            if time.monotonic() >= deadline:
                raise ChildNotStarted(f"the command sidecar at {path} is not answering "
                                      f"after {seconds:g} s: {exc.strerror}") from exc
            time.sleep(0.05)
        except OSError as exc:
            sock.close()
            raise ChildNotStarted(f"cannot reach the command sidecar at {path}: "
                                  f"{exc.strerror or exc}") from exc


# -- the runner's side ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    argv: list[str]
    cwd: Path
    env: dict[str, str]


def parse_start(message: Mapping[str, Any]) -> Start:
    """The first message of a connection, checked; ProtocolError says what is wrong."""
    start = message.get("start")
    if not isinstance(start, dict) or set(start) != {"argv", "cwd", "env"}:
        raise ProtocolError('the first message must be {"start": {"argv", "cwd", "env"}}')
    argv, cwd, env = start["argv"], start["cwd"], start["env"]
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
            and argv[0]):
        raise ProtocolError("argv must be a non-empty list of strings, argv[0] not empty")
    if not (isinstance(cwd, str) and os.path.isabs(cwd)):
        raise ProtocolError("cwd must be an absolute path")
    if not (isinstance(env, dict) and all(
            isinstance(k, str) and k and "=" not in k and isinstance(v, str)
            for k, v in env.items())):
        raise ProtocolError("env must map names (non-empty, without '=') to strings")
    for text in (*argv, cwd, *env, *env.values()):
        if "\0" in text:
            raise ProtocolError("argv, cwd and env must not hold NUL")
    return Start(argv=argv, cwd=Path(cwd), env=env)


class CommandRunner:
    """``jobfence command-runner``: listens on ``path`` and runs one child per connection,
    one connection at a time, until ``stop`` (SIGTERM: the pod is going away) kills the
    child in hand."""

    def __init__(self, path: Path, sandbox: Sandbox) -> None:
        self.path = path
        self.sandbox = sandbox
        self.stopping = threading.Event()
        self.served = 0
        self._lock = threading.Lock()
        self._child: LocalChild | None = None

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            child = self._child
        if child is not None and child.kill():
            kill_descendants(reap_children=False)

    def serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a socket left by a runner before this one
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound and listening under another name first, then renamed into place: the path
        # appears only once a connection to it is accepted (no refused first connect).
        pending = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            pending.unlink()
        old = os.umask(0o177)
        try:
            listener.bind(str(pending))
        finally:
            os.umask(old)
        listener.listen(4)
        os.replace(pending, self.path)
        listener.settimeout(0.2)
        log.info("command_runner_listening", socket=str(self.path))
        try:
            while not self.stopping.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                conn.settimeout(FIRST_MESSAGE_SECONDS)  # a silent peer is not waited for
                self.handle(Channel(conn))
        finally:
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def handle(self, channel: Channel) -> int | None:
        """Run the one child a connection asks for; its exit status (None if none ran)."""
        try:
            message = channel.receive()
            if message is None:
                channel.close()
                return None
            start = parse_start(message)
        except ProtocolError as exc:
            with contextlib.suppress(OSError):
                channel.send(error=f"command sidecar: {exc}")
            channel.close()
            return None
        except OSError:  # a timeout included
            channel.close()
            return None
        channel.sock.settimeout(None)

        announced = threading.Event()  # output goes out after "started", never before

        def stream(name: str, chunk: bytes) -> None:
            announced.wait()
            with contextlib.suppress(OSError):  # the worker is gone: keep draining the pipe
                channel.send(**{name: base64.b64encode(chunk).decode()})

        try:
            child = self.sandbox.start_here(start.argv, start.cwd, start.env, sink=stream)
        except (ChildNotStarted, OSError) as exc:
            with contextlib.suppress(OSError):
                channel.send(error=str(exc))
            channel.close()
            return None
        with self._lock:
            self._child = child
        if self.stopping.is_set():
            child.kill()
        self.served += 1
        log.debug("command_started", pid=child.pid, program=start.argv[0])
        with contextlib.suppress(OSError):
            channel.send(started=child.pid)
        announced.set()
        follower = threading.Thread(target=self._follow, args=(channel, child), daemon=True)
        follower.start()
        code = child.wait(None)
        child.close()  # its group, then its pipes drained
        kill_descendants(reap_children=True)  # what left its group (setsid, daemons)
        with self._lock:
            self._child = None
        with contextlib.suppress(OSError):
            channel.send(exit=code)
        channel.close()
        follower.join(timeout=1)
        log.debug("command_exited", pid=child.pid, exit_code=code)
        return code

    @staticmethod
    def _follow(channel: Channel, child: LocalChild) -> None:
        """The worker's side of a running child: kill it when asked, and when the worker
        goes away (the connection closes)."""
        while True:
            try:
                message = channel.receive()
            except (OSError, ProtocolError):
                message = None
            if (message is None or message.get("kill") is True) and child.kill():
                kill_descendants(reap_children=False)
            if message is None:
                return
