"""A TCP forwarder that follows a Patroni cluster's leader, as HAProxy does in front of
Patroni (a health check on the REST API's ``/primary``, ``on-marked-down
shutdown-sessions``): each new connection goes to the member that is leader now, and when
the leader changes every session to the old one is cut. What a service that follows the
primary (CloudNativePG's ``-rw``, a Patroni VIP) gives PgBouncer in production; the failover
run puts PgBouncer behind it.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import selectors
import socket
import threading
from collections.abc import Callable

from devtools.embedded_pg import free_port


class LeaderProxy:
    """Listens on 127.0.0.1:``port``; ``leader_port`` says where the leader's server listens
    now (None: no leader — new connections are refused until there is one)."""

    def __init__(self, leader_port: Callable[[], int | None], *, check_seconds: float = 0.5,
                 port: int | None = None) -> None:
        self.leader_port = leader_port
        self.check_seconds = check_seconds
        self.port = port or free_port()
        self._target: int | None = None
        self._sessions: list[tuple[socket.socket, socket.socket, int]] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self.switches = 0

    def start(self) -> LeaderProxy:
        self._target = self._check()
        for target in (self._accept, self._watch):
            threading.Thread(target=target, daemon=True, name="leader-proxy").start()
        return self

    def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._cut(lambda port: True)

    def __enter__(self) -> LeaderProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> int | None:
        try:
            return self.leader_port()
        except Exception:
            return None

    def _watch(self) -> None:
        while not self._closing.wait(self.check_seconds):
            now = self._check()
            if now != self._target:
                old, self._target = self._target, now
                self.switches += 1
                self._cut(functools.partial(operator.eq, old))

    def _cut(self, which: Callable[[int], bool]) -> None:
        with self._lock:
            cut = [s for s in self._sessions if which(s[2])]
            self._sessions = [s for s in self._sessions if not which(s[2])]
        for client, server, _ in cut:
            for s in (client, server):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            target = self._target
            if target is None:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", target), timeout=2)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sessions.append((client, server, target))
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, client: socket.socket, server: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        try:
            sel.register(client, selectors.EVENT_READ, server)
            sel.register(server, selectors.EVENT_READ, client)
            while True:
                for key, _ in sel.select():
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            sel.close()
            for s in (client, server):
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock:
                self._sessions = [x for x in self._sessions if x[0] is not client]

