"""moto's S3 in server mode, on 127.0.0.1 only (its default binds 0.0.0.0:5000), in this
process: what the tests, the demo and the benchmarks use for S3."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Start moto's S3 server on a free loopback port; its endpoint URL."""
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{server._server.server_port}"
    finally:
        server.stop()
