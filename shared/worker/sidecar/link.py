"""The worker's side of the command sidecar (the protocol: ``.protocol``).

``SidecarLink`` listens on ``JOBFENCE_COMMAND_SOCKET`` in a directory that only the worker's
user may write (checked at start; in the shipped pod the runner mounts it read-only), and
takes exactly one runner connection in its life — from ``JOBFENCE_COMMAND_RUNNER_UID``
(``SO_PEERCRED``), or from root or the worker's own uid when that is unset — then closes
the listening socket and removes its name. A job's child therefore finds no socket to
connect to, rename or replace, and cannot be the runner: none exists before the runner has
dialed in, and when the runner's connection closes its container ended with every child in
it. A lost runner is never replaced: the worker fails the command in hand and claims no
more jobs (its pod ends; KEDA starts another).

``SidecarSpace`` is a job's space kept by the runner, and ``SidecarChild`` a child it runs.
The worker never sees the space's directories: it writes inputs into, and uploads outputs
from, descriptors the runner hands over, each checked with ``fstat`` (a regular file; for
an output, the inode that was listed, the job's, with one name).
"""

from __future__ import annotations

import base64
import contextlib
import os
import select
import socket
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO
from uuid import UUID

from jobfence.actions.child import ChildLost, ChildNotStarted, SpacePaths, Usage
from jobfence.fsboundary import BoundaryError, Listed, Refused, check_regular, refusal
from jobfence.logs import get_logger
from jobfence.worker.faults import FAULTS
from jobfence.worker.sidecar.listen import listen
from jobfence.worker.sidecar.protocol import (
    CLOSE_SECONDS,
    CONNECT_SECONDS,
    REPLY_SECONDS,
    STARTED_SECONDS,
    Channel,
    ProtocolError,
    close_all,
    read_reply,
)

log = get_logger("jobfence.sidecar")


class SidecarLink:
    """The one connection to the command runner, taken when the first command needs it."""

    def __init__(self, path: Path, runner_uid: int | None = None,
                 connect_seconds: float = CONNECT_SECONDS) -> None:
        self.path = path
        self.runner_uid = runner_uid
        self.connect_seconds = connect_seconds
        self._listener: socket.socket | None
        self._listener, self._ino = listen(path)
        self._control: Channel | None = None
        self._lost: str | None = None
        self._lock = threading.Lock()

    def _stop_listening(self) -> None:
        if self._listener is None:
            return
        self._listener.close()
        self._listener = None
        with contextlib.suppress(OSError):
            if os.lstat(self.path).st_ino == self._ino:
                os.unlink(self.path)

    def _accepted(self) -> Channel:
        assert self._listener is not None
        self._listener.settimeout(self.connect_seconds)
        try:
            conn, _ = self._listener.accept()
        except TimeoutError:
            raise ChildNotStarted(f"the command sidecar did not connect to {self.path} "
                                  f"within {self.connect_seconds:g} s") from None
        finally:
            self._stop_listening()  # one runner in this worker's life, never another
        _, uid, _ = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        allowed = {self.runner_uid} if self.runner_uid is not None else {0, os.geteuid()}
        channel = Channel(conn)
        if uid not in allowed:
            channel.close()
            raise ChildNotStarted(f"refused a command runner of uid {uid} on {self.path} "
                                  f"(expected {', '.join(map(str, sorted(allowed)))})")
        conn.settimeout(self.connect_seconds)
        try:
            hello = channel.receive()
        except (OSError, ProtocolError) as exc:
            channel.close()
            raise ChildNotStarted(f"the command runner on {self.path} failed: {exc}") from exc
        if not hello or not isinstance(hello.get("runner"), dict):
            channel.close()
            raise ChildNotStarted(f"what connected to {self.path} is not a command runner")
        conn.settimeout(None)
        log.info("command_runner_accepted", socket=str(self.path), uid=uid)
        return channel

    def request(self, **message: Any) -> Channel:
        """A new channel to the runner with ``message`` sent on it; ChildNotStarted when
        there is no runner (any more)."""
        channel = self.channel()
        try:
            channel.send(**message)
        except OSError as exc:
            channel.close()
            raise ChildLost(f"the command sidecar failed: {exc}") from exc
        return channel

    def channel(self) -> Channel:
        """A new channel to the runner (the first one waits for the runner to dial in);
        ChildNotStarted when there is no runner (any more)."""
        with self._lock:
            if self._lost is not None:
                raise ChildNotStarted(self._lost)
            try:
                if self._control is None:
                    self._control = self._accepted()
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    self._control.send(fds=[theirs.fileno()], channel=1)
                finally:
                    theirs.close()
            except ChildNotStarted as exc:
                self._lost = f"{exc}; this worker starts no more commands"
                raise
            except OSError as exc:
                self._lost = (f"the command sidecar went away ({exc.strerror or exc}); this "
                              "worker starts no more commands")
                raise ChildNotStarted(self._lost) from exc
        return Channel(mine)

    def lose(self, why: str) -> None:
        """The runner can no longer be trusted to answer: start nothing more here."""
        with self._lock:
            if self._lost is None:
                self._lost = f"the command sidecar {why}; this worker starts no more commands"
                log.warning("command_sidecar_lost", reason=why)

    def usable(self) -> bool:
        """Whether commands can still start here: no runner yet, or its connection open
        (the runner never writes on it, so anything readable means it is gone)."""
        with self._lock:
            if self._lost is None and self._control is not None:
                poller = select.poll()
                poller.register(self._control.sock, select.POLLIN)
                if poller.poll(0):
                    self._lost = "the command sidecar went away; this worker starts no more " \
                                 "commands"
            return self._lost is None

    def close(self) -> None:
        with self._lock:
            self._stop_listening()
            if self._control is not None:
                self._control.close()
            self._lost = self._lost or "the worker is closing"


def _reply(link: SidecarLink, channel: Channel,
           seconds: float = REPLY_SECONDS) -> tuple[dict[str, Any], list[int]]:
    """The runner's next answer on ``channel``, within ``seconds``; a runner that fails to
    answer is lost (ChildLost)."""
    channel.sock.settimeout(seconds)
    try:
        got = channel.receive_with_fds()
    except (OSError, ProtocolError) as exc:
        channel.close()
        link.lose(f"failed to answer ({exc or type(exc).__name__})")
        raise ChildLost(f"the command sidecar failed: {exc or type(exc).__name__}") from exc
    if got is None:
        channel.close()
        link.lose("closed a request unanswered")
        raise ChildLost("the command sidecar closed the request unanswered")
    return got


def _call(link: SidecarLink, seconds: float = REPLY_SECONDS,
          **message: Any) -> tuple[Channel, dict[str, Any], list[int]]:
    """Send a request; its channel and first reply. ChildLost when the runner fails,
    BoundaryError when it refuses."""
    channel = link.request(**message)
    reply, fds = _reply(link, channel, seconds)
    if "error" in reply:
        FAULTS.adopt(reply.get("faults"))
        close_all(fds)
        channel.close()
        raise BoundaryError(str(reply["error"]))
    return channel, reply, fds


class SidecarSpace:
    """A job's space kept by the command runner (``jobfence.worker.jobspace.JobSpace``)."""

    def __init__(self, link: SidecarLink, attempt_id: UUID) -> None:
        self.link = link
        self.attempt = str(attempt_id)
        self.paths: SpacePaths | None = None

    def open(self) -> SpacePaths:
        if self.paths is None:
            channel, reply, _ = _call(self.link, open={"attempt": self.attempt})
            channel.close()
            try:
                s = reply["space"]
                self.paths = SpacePaths(str(s["workdir"]), str(s["inputs"]),
                                        str(s["outputs"]), int(s["uid"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ChildLost(f"the command sidecar answered {str(reply)[:200]}") from exc
        return self.paths

    def create_inputs(self, paths: Sequence[str]) -> list[BinaryIO]:
        channel, reply, fds = _call(self.link, inputs={"attempt": self.attempt,
                                                       "paths": list(paths)})
        channel.close()
        if reply.get("created") != len(paths) or len(fds) != len(paths):
            close_all(fds)
            raise ChildLost(f"the command sidecar answered {str(reply)[:200]}")
        files: list[BinaryIO] = [os.fdopen(fd, "wb") for fd in fds]
        try:
            for path, f in zip(paths, files, strict=True):
                check_regular(f, path)
        except BaseException:
            for f in files:
                f.close()
            raise
        return files

    def list_outputs(self) -> tuple[list[Listed], list[Refused]]:
        channel, reply, _ = _call(self.link, outputs={"attempt": self.attempt})
        listed: list[Listed] = []
        try:
            while "listed" in reply:
                listed += [Listed(str(i["path"]), int(i["size"]), int(i["dev"]),
                                  int(i["ino"])) for i in reply["listed"]]
                reply, fds = _reply(self.link, channel)
                close_all(fds)
            if reply.get("done") is not True:
                raise ChildLost(f"the command sidecar answered {str(reply)[:200]}")
            refused = [Refused(str(r["path"]), str(r["why"])) for r in reply["refused"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ChildLost(f"the command sidecar failed listing outputs: {exc}") from exc
        finally:
            channel.close()
        return listed, refused

    def open_outputs(self, items: Sequence[Listed]) -> list[BinaryIO | str]:
        channel, reply, fds = _call(self.link, open_outputs={
            "attempt": self.attempt, "items": [
                {"path": i.path, "size": i.size, "dev": i.dev, "ino": i.ino} for i in items]})
        channel.close()
        opened = reply.get("opened")
        if not (isinstance(opened, list) and len(opened) == len(items)
                and sum(o is None for o in opened) == len(fds)):
            close_all(fds)
            raise ChildLost(f"the command sidecar answered {str(reply)[:200]}")
        uid = self.open().uid
        out: list[BinaryIO | str] = []
        given = iter(fds)
        for item, why in zip(items, opened, strict=True):
            if why is not None:
                out.append(str(why))
                continue
            fd = next(given)
            st = os.fstat(fd)
            problem = refusal(st, uid) or (None if (st.st_dev, st.st_ino) == (item.dev, item.ino)
                                           else "not the file that was listed")
            if problem is not None:
                os.close(fd)
                out.append(problem)
            else:
                out.append(os.fdopen(fd, "rb"))
        return out

    def read_file(self, name: str, limit: int) -> bytes | None:
        channel, reply, fds = _call(self.link, read={"attempt": self.attempt, "name": name,
                                                     "limit": limit})
        channel.close()
        close_all(fds)
        try:
            return read_reply(reply, limit)
        except ProtocolError as exc:
            raise ChildLost(f"the command sidecar answered {str(reply)[:200]}") from exc

    def start(self, argv: Sequence[str], env: Mapping[str, str],
              sink: Callable[[str, bytes], None]) -> SidecarChild:
        try:
            channel, reply, _ = _call(self.link, STARTED_SECONDS, start={
                "attempt": self.attempt, "argv": list(argv), "env": dict(env)})
        except (BoundaryError, ChildLost) as exc:
            raise ChildNotStarted(str(exc)) from exc
        if not isinstance(reply.get("started"), int):
            channel.close()
            raise ChildNotStarted(f"the command sidecar answered {str(reply)[:200]}")
        channel.sock.settimeout(None)  # the child's output comes when it comes
        return SidecarChild(channel, self.link, sink)

    def close(self) -> None:
        if self.paths is None:
            return
        self.paths = None
        try:
            channel, _, _ = _call(self.link, close={"attempt": self.attempt})
            channel.close()
        except (ChildNotStarted, ChildLost, BoundaryError) as exc:
            log.warning("space_not_closed", attempt_id=self.attempt, error=str(exc))


class SidecarChild:
    """A job's child running in the command sidecar (the ``Child`` of jobfence.worker.sandbox)."""

    pgid: int | None = None  # not ours to kill: ``kill`` asks the runner

    def __init__(self, channel: Channel, link: SidecarLink,
                 sink: Callable[[str, bytes], None]) -> None:
        self._channel = channel
        self._link = link
        self._where = link.path
        self._sink = sink
        self._code: int | None = None
        self._usage: Usage | None = None
        self._lost: str | None = None
        self._ended = threading.Event()
        self._reader = threading.Thread(target=self._read, name="sidecar-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while (message := self._channel.receive()) is not None:
                if "exit" in message:
                    FAULTS.adopt(message.get("faults"))
                    self._code = int(message["exit"])
                    self._usage = Usage.reported(message.get("usage"))
                    return
                for stream in ("out", "err"):
                    if stream in message:
                        chunk = base64.b64decode(message[stream])
                        try:
                            self._sink(stream, chunk)
                        except Exception as exc:  # the job's bytes: noted, read on
                            FAULTS.note("output", exc)
            self._lost = "closed the connection while the command ran"
        except (OSError, ProtocolError, ValueError, TypeError) as exc:
            self._lost = f"failed while the command ran: {exc}"
        except Exception as exc:  # a bug here: the child is lost to us, never unguarded
            FAULTS.note("sidecar", exc)
            self._lost = f"could not be read while the command ran: {exc!r}"
        finally:
            if self._lost is not None:
                self._link.lose(self._lost)
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
            if not self._ended.wait(CLOSE_SECONDS):
                self._link.lose(f"did not confirm within {CLOSE_SECONDS:g} s that a killed "
                                "child is gone")
        self._channel.close()  # a runner still serving kills what is left when it sees this
        self._reader.join(timeout=1)

    def ended(self) -> bool:
        """Only once the runner said so: it sends the exit after the child's group and every
        descendant are gone."""
        return self._ended.is_set() and self._lost is None

    def usage(self) -> Usage | None:
        return self._usage


class SidecarSpaces:
    """Jobs' spaces kept by the command sidecar, their children its own (the ``Spaces`` of
    ``jobfence.worker.sandbox``): its children run as its user, which their environment
    names."""

    names_user = True

    def __init__(self, link: SidecarLink) -> None:
        self.link = link

    def space(self, attempt_id: UUID) -> SidecarSpace:
        return SidecarSpace(self.link, attempt_id)

    def ready(self) -> bool:
        return self.link.usable()

    def close(self) -> None:
        self.link.close()
