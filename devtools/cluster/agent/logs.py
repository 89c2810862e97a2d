"""The one kubelet endpoint the node agent serves: containers' logs, for ``kubectl logs``
(the API server proxies ``pods/log`` to the node's InternalIP and this port). HTTPS with
the node's serving certificate; only the API server's own client certificate
(``kube-apiserver-kubelet-client``, from the cluster's CA) is served. ``follow`` streams
until the container has ended; ``tailLines`` and ``limitBytes`` are honoured; timestamps
and ``previous`` are not modelled (nothing is restarted)."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

Locate = Callable[[str, str, str], tuple[Path, Callable[[], bool]] | None]
"""(namespace, pod, container) → its log file and whether it still runs, or None."""

API_SERVER = "kube-apiserver-kubelet-client"


class LogServer:
    def __init__(self, *, cert: Path, key: Path, ca: Path, locate: Locate) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED
        handler = _handler(locate)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="kubelet-logs")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()


def _handler(locate: Locate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked: kubectl logs -f streams
        def log_message(self, format: str, *args: object) -> None:
            return

        def do_GET(self) -> None:
            peer = self.connection.getpeercert() if hasattr(self.connection, "getpeercert") \
                else None
            subject = dict(x[0] for x in (peer or {}).get("subject", ()))
            if subject.get("commonName") != API_SERVER:
                self.send_error(403, "only the API server may ask")
                return
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "the node agent serves containerLogs only")
                return
            found = locate(parts[1], parts[2], parts[3])
            if found is None:
                self.send_error(404, f"no container {parts[3]} of pod {parts[1]}/{parts[2]}")
                return
            path, running = found
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            data = path.read_bytes() if path.exists() else b""
            if query.get("tailLines"):
                lines = data.splitlines(keepends=True)
                data = b"".join(lines[-int(query["tailLines"]):]) if int(
                    query["tailLines"]) else b""
            if query.get("limitBytes"):
                data = data[:int(query["limitBytes"])]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(data)
            if query.get("follow") == "true":
                offset = path.stat().st_size if path.exists() else 0
                while True:
                    alive = running()
                    if path.exists() and path.stat().st_size > offset:
                        with open(path, "rb") as f:
                            f.seek(offset)
                            more = f.read()
                        offset += len(more)
                        self._chunk(more)
                    elif not alive:
                        break
                    else:
                        time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, data: bytes) -> None:
            if data:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

    return Handler
