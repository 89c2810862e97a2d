"""``jobfence serve``: the operators' console at ``/`` and the JSON API under ``/api/v1/``
(docs/CONSOLE.md), from one stateless process. It reads and writes only through the store:
writes as its login's role (the operator's), reads as the reader's when
``JOBFENCE_READER_DATABASE_URL`` is set (as the shipped component sets it), each with a few
pooled connections; it starts periodic functions through the cluster port; SIGTERM lets the
requests in flight finish, then it exits 0."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from jobfence import cli, logs
from jobfence.adapters import open_cluster
from jobfence.console.auth import Authenticator
from jobfence.db import Pool
from jobfence.errors import InvalidSpec


def _server_class() -> type:
    import uvicorn

    class Quiet(uvicorn.Server):
        """uvicorn's server, stopping on SIGTERM/SIGINT after the requests in flight
        (uvicorn raises the signal again once stopped: a clean stop here exits 0)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.handle_exit)
            yield

    return Quiet


def main(argv: list[str]) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence serve", description="Serve the console and the HTTP "
                       "API (JOBFENCE_AUTH says who may call it).")
        p.add_argument("--host", default="127.0.0.1",
                       help="the address to listen on (default 127.0.0.1)")
        p.add_argument("--port", type=int, default=8080, help="the port (default 8080)")
        args = p.parse_args(argv)
        if not 0 <= args.port <= 65535:
            raise InvalidSpec("--port must be from 0 to 65535")
        settings = cli.setup("serve")
        log = logs.get_logger("serve")
        cluster = (open_cluster(settings, settings.installation or "")
                   if settings.cluster != "none" else None)
        auth = Authenticator(settings, bind_host=args.host,
                             review=cluster.review_token if cluster is not None
                             and settings.auth == "tokenreview" else None)
        pools = [Pool(url, size=settings.serve_connections, pooler=settings.database_pooler,
                      application_name=name, connect_timeout=settings.connect_timeout_seconds)
                 for url, name in ((settings.database_url, "jobfence-serve"),
                                   (settings.reader_database_url, "jobfence-serve-reader"))
                 if url]
        import uvicorn

        from jobfence.console.api import Server

        Quiet = _server_class()

        app = Server(settings, pools[0], auth, cluster, reader=pools[-1]).app()
        for pool in pools:
            pool.open()
        try:
            config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None,
                                    access_log=False, lifespan="off", server_header=False,
                                    timeout_graceful_shutdown=20)
            host = f"[{args.host}]" if ":" in args.host else args.host
            log.info("serving", url=f"http://{host}:{args.port}/", auth=settings.auth)
            Quiet(config).run()
        finally:
            for pool in pools:
                pool.close()
        return 0

    return cli.run_command("serve", body)
