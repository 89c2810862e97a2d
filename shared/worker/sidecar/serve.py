"""The command sidecar's side (``jobfence command-runner``): dial the worker, then serve its
channels, each on a thread of its own (the protocol: ``jobfence.worker.sidecar.protocol``):
a worker running many jobs at once has as many children running here.

The sidecar keeps each running job's space (``jobfence.worker.jobspace.LocalSpace`` under its
scratch directory): it makes the directories, hands the worker descriptors of new input
files and of the job's accepted output files, and starts the children there, as the job's
user (a uid of its own per job where the runner may switch users; in the shipped pod, which
may not, its own uid). It never listens: a child has nothing to connect to. It is
non-dumpable (``protect_worker``): the start messages it received (jobs' ``env``) cannot be
read from its memory by a child of its own uid.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from jobfence.actions.child import ChildNotStarted
from jobfence.fsboundary import BoundaryError, Listed
from jobfence.jobuids import Users
from jobfence.logs import get_logger
from jobfence.worker.faults import FAULTS
from jobfence.worker.jobspace import LocalSpace
from jobfence.worker.proctree import Tree, kill_descendants
from jobfence.worker.sandbox import LocalChild
from jobfence.worker.sidecar.protocol import (
    FIRST_MESSAGE_SECONDS,
    LISTED_PER_MESSAGE,
    Channel,
    ProtocolError,
    close_all,
    parse_request,
)

log = get_logger("jobfence.sidecar")

DIAL_SECONDS = 0.05
"""How often the runner tries the worker's socket until the worker listens."""


class SidecarServer:
    """Dials ``path`` and serves the worker there until ``stop`` (SIGTERM: the pod is going
    away) kills the children in hand; after a worker goes, dials again for the next."""

    def __init__(self, path: Path, users: Users, scratch: Path | None = None) -> None:
        self.path = path
        self.users = users
        self.scratch = scratch
        """The runner's own directory for the jobs' spaces, emptied of what the children's
        user left there when a job ends (the pod's scratch volume); default: the temporary
        directory, not emptied."""
        self.stopping = threading.Event()
        self.served = 0
        self._lock = threading.Lock()
        self._children: dict[int, LocalChild] = {}
        self._spaces: dict[str, LocalSpace] = {}

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            children = list(self._children.values())
        if [c for c in children if c.kill()]:
            kill_descendants(reap_children=False)

    # -- the control connection ------------------------------------------------------------

    def serve(self) -> None:
        log.info("command_runner_dialing", socket=str(self.path))
        while not self.stopping.is_set():
            control = self._dial()
            if control is None:
                break
            log.info("command_runner_connected", socket=str(self.path))
            try:
                self._serve_control(control)
            except Exception as exc:  # as if the worker went: its jobs' spaces go, dial again
                FAULTS.note("sidecar", exc)
            finally:
                control.close()
                self._close_spaces()

    def _dial(self) -> Channel | None:
        while not self.stopping.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.path))
            except OSError:
                sock.close()
                self.stopping.wait(DIAL_SECONDS)
                continue
            channel = Channel(sock)
            try:
                channel.send(runner={"version": 1, "pid": os.getpid()})
            except OSError:
                channel.close()
                continue
            return channel
        return None

    def _serve_control(self, control: Channel) -> None:
        control.sock.settimeout(0.2)  # to see ``stopping``
        while not self.stopping.is_set():
            try:
                got = control.receive_with_fds()
            except TimeoutError:
                continue
            except (OSError, ProtocolError) as exc:
                log.warning("command_runner_control_failed", error=str(exc))
                return
            if got is None:
                log.info("command_runner_worker_gone")
                return
            message, fds = got
            if message != {"channel": 1} or len(fds) != 1:
                close_all(fds)
                log.warning("command_runner_control_refused", message=str(message)[:200])
                return
            try:
                channel = Channel(socket.socket(fileno=fds[0]))
            except OSError:
                close_all(fds)
                continue
            try:
                threading.Thread(target=self._handle_guarded, args=(channel,), daemon=True,
                                 name="channel").start()
            except Exception as exc:  # no thread for it: refused, the next one may get one
                FAULTS.note("sidecar", exc)
                self._refuse(channel, f"command sidecar: {exc}")

    def _handle_guarded(self, channel: Channel) -> None:
        """A channel's thread: whatever its request raises is noted and refused, never the
        end of the runner."""
        try:
            self.handle(channel)
        except Exception as exc:
            FAULTS.note("sidecar", exc)
            self._refuse(channel, f"command sidecar: {exc!r}"[:500])

    # -- one channel -----------------------------------------------------------------------

    def handle(self, channel: Channel) -> int | None:
        """Serve the one request of a channel; a started child's exit status (None if
        none ran)."""
        channel.sock.settimeout(FIRST_MESSAGE_SECONDS)  # a silent peer is not waited for
        try:
            message = channel.receive()
            if message is None:
                channel.close()
                return None
            kind, args = parse_request(message)
        except ProtocolError as exc:
            self._refuse(channel, f"command sidecar: {exc}")
            return None
        except OSError:
            channel.close()
            return None
        channel.sock.settimeout(None)
        try:
            if kind == "start":
                return self._start(channel, args)
            self._answer(channel, kind, args)
        except (BoundaryError, ChildNotStarted, OSError, ValueError) as exc:
            self._refuse(channel, str(exc))
            return None
        channel.close()
        return None

    @staticmethod
    def _refuse(channel: Channel, why: str) -> None:
        with contextlib.suppress(Exception):
            _send_with_faults(channel, {"error": why})
        with contextlib.suppress(Exception):
            channel.close()

    def _space_of(self, attempt: str, *, make: bool = False) -> LocalSpace:
        with self._lock:
            space = self._spaces.get(attempt)
            if space is not None:
                return space
            if not make:
                raise BoundaryError(f"no open space for attempt {attempt}")
            space = LocalSpace(self.scratch or Path(tempfile.gettempdir()), attempt,
                               self.users, sweep_base=self.scratch is not None)
            self._spaces[attempt] = space
            return space

    def _close_space(self, attempt: str) -> None:
        with self._lock:
            space = self._spaces.pop(attempt, None)
        if space is not None:
            space.close()

    def _close_spaces(self) -> None:
        """The worker went away: whatever its jobs left goes now."""
        with self._lock:
            spaces, self._spaces = list(self._spaces.values()), {}
        for space in spaces:
            space.close()

    def _answer(self, channel: Channel, kind: str, args: dict[str, Any]) -> None:
        attempt = str(args["attempt"])
        if kind == "close":
            self._close_space(attempt)
            channel.send(closed=True)
            return
        space = self._space_of(attempt, make=kind == "open")
        if kind == "open":
            paths = space.open()
            channel.send(space={"workdir": paths.workdir, "inputs": paths.inputs,
                                "outputs": paths.outputs, "uid": paths.uid})
        elif kind == "inputs":
            files = space.create_inputs(args["paths"])
            try:
                channel.send(fds=[f.fileno() for f in files], created=len(files))
            finally:
                for f in files:
                    f.close()
        elif kind == "outputs":
            listed, refused = space.list_outputs()
            for i in range(0, len(listed), LISTED_PER_MESSAGE):
                channel.send(listed=[{"path": f.path, "size": f.size, "dev": f.dev,
                                      "ino": f.ino} for f in listed[i:i + LISTED_PER_MESSAGE]])
            channel.send(refused=[r.as_dict() for r in refused], done=True)
        elif kind == "read":
            data = space.read_file(args["name"], args["limit"])
            channel.send(read=None if data is None else base64.b64encode(data).decode())
        elif kind == "open_outputs":
            opened = space.open_outputs([Listed(**item) for item in args["items"]])
            files = [f for f in opened if not isinstance(f, str)]
            try:
                channel.send(fds=[f.fileno() for f in files],
                             opened=[f if isinstance(f, str) else None for f in opened])
            finally:
                for file in files:
                    file.close()

    def _kill_tree(self, child: LocalChild, attempt: str, *, reap_children: bool) -> None:
        """Kill what of this process's descendants is this child's job's: all of them when
        no other child runs here, else its session and what carries its attempt id."""
        def alone() -> bool:
            with self._lock:
                return not [c for c in self._children.values() if c is not child]

        kill_descendants(reap_children=reap_children, alone=alone,
                         tree=Tree(frozenset({child.pid}),
                                   f"JOBFENCE_ATTEMPT_ID={attempt}".encode()))

    def _start(self, channel: Channel, args: dict[str, Any]) -> int | None:
        attempt = str(args["attempt"])
        space = self._space_of(attempt)
        announced = threading.Event()  # output goes out after "started", never before

        def stream(name: str, chunk: bytes) -> None:
            announced.wait()
            message: dict[str, Any] = {name: base64.b64encode(chunk).decode()}
            with contextlib.suppress(OSError):  # the worker is gone: keep draining the pipe
                channel.send(**message)

        child = space.start(args["argv"], args["env"], sink=stream)
        with self._lock:
            self._children[child.pid] = child
        if self.stopping.is_set():
            child.kill()
        self.served += 1
        log.debug("command_started", pid=child.pid, program=args["argv"][0])
        with contextlib.suppress(OSError):
            channel.send(started=child.pid)
        announced.set()
        follower = threading.Thread(target=self._follow, args=(channel, child, attempt),
                                    daemon=True)
        follower.start()
        code = child.wait(None)
        child.close()  # its group, then its pipes drained
        with self._lock:
            del self._children[child.pid]
        # what left its group (setsid, daemons): its own only, while others run here
        self._kill_tree(child, attempt, reap_children=True)
        used = child.usage()
        ended: dict[str, Any] = {"exit": code}
        if used is not None:
            ended["usage"] = used.as_dict()
        _send_with_faults(channel, ended)
        channel.close()
        follower.join(timeout=1)
        log.debug("command_exited", pid=child.pid, exit_code=code)
        return code

    def _follow(self, channel: Channel, child: LocalChild, attempt: str) -> None:
        """The worker's side of a running child: kill it when asked, and when the worker
        goes away (the channel closes)."""
        while True:
            try:
                message = channel.receive()
            except (OSError, ProtocolError):
                message = None
            except Exception as exc:  # unreadable: as if the worker went (the child dies)
                FAULTS.note("sidecar", exc)
                message = None
            if (message is None or message.get("kill") is True) and child.kill():
                self._kill_tree(child, attempt, reap_children=False)
            if message is None:
                return


def _send_with_faults(channel: Channel, message: dict[str, Any]) -> None:
    """Send the answer that ends a request with the faults this runner's guards noted since
    the last one (the worker counts them with its own: invariant 15); kept for the next
    answer when this one cannot be sent."""
    faults = FAULTS.take()
    try:
        channel.send(**({**message, "faults": faults} if faults else message))
    except BaseException:
        FAULTS.restore(faults)
        raise
