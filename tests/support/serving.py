"""A real ``jobfence serve`` for a test: the CLI started as a subprocess (as the login of the
operator role) on a free port of 127.0.0.1, ready once ``/healthz`` answers."""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.support import JOBFENCE, REPO, cli_env
from tests.support.procs import kill_quietly


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


def _reply(status: int, text: bytes, headers: Any) -> Reply:
    low = {k.lower(): v for k, v in headers}
    json_body = low.get("content-type", "").startswith("application/json")
    return Reply(status, json.loads(text) if text and json_body else text.decode(), low)


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[str]

    def call(self, method: str, path: str, body: Any = None, *,
             headers: dict[str, str] | None = None, raw: bytes | None = None) -> Reply:
        sent = {"Accept": "application/json", **(headers or {})}
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
        if method == "POST" and "Content-Type" not in sent:
            sent["Content-Type"] = "application/json"
            data = data if data is not None else b"{}"
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return _reply(resp.status, resp.read(), resp.headers.items())
        except urllib.error.HTTPError as err:
            return _reply(err.code, err.read(), err.headers.items())

    def post_chunked(self, path: str, chunks: Iterable[bytes], *,
                     headers: dict[str, str] | None = None) -> tuple[Reply, int]:
        """POST ``chunks`` with ``Transfer-Encoding: chunked``, as a client streaming a body
        it makes as it goes; it stops sending as soon as the server answers (or hangs up).
        The answer, and how many bytes of the body were sent."""
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        head = {"Host": f"{host}:{port}", "Content-Type": "application/json",
                "Transfer-Encoding": "chunked", **(headers or {})}
        sent = 0
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall((f"POST {path} HTTP/1.1\r\n" + "".join(
                f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n").encode())
            try:
                for chunk in chunks:
                    if select.select([sock], [], [], 0)[0]:
                        break  # the server has answered before the end
                    sock.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                    sent += len(chunk)
                else:
                    sock.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                pass  # it hung up: its answer is already here
            resp = http.client.HTTPResponse(sock)
            resp.begin()
            return _reply(resp.status, resp.read(), resp.getheaders()), sent

    def get(self, path: str, **kw: Any) -> Reply:
        return self.call("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return self.call("POST", path, body, **kw)


@contextmanager
def serve(dsn: str, *, host: str = "127.0.0.1", **env: str) -> Iterator[Served]:
    port = free_port()
    proc = subprocess.Popen([*JOBFENCE, "serve", "--host", host, "--port", str(port)],
                            env=cli_env(dsn, "serve", **env), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    served = Served(f"http://127.0.0.1:{port}", proc)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"jobfence serve exited {proc.returncode}: "
                                     f"{proc.stderr.read() if proc.stderr else ''}")
            try:
                with urllib.request.urlopen(served.url + "/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield served
    finally:
        kill_quietly(proc)
