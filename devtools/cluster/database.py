"""The cluster's own PostgreSQL: a throwaway server (``devtools.embedded_pg``) that outlives
``cluster-up`` — ``cluster-down`` stops it — with jobfence migrated in database ``jobfence``
under the base's installation, and a login per role, as a DBA would set them up
(manifests/README.md, "Prerequisites")."""

from __future__ import annotations

import atexit
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from devtools.embedded_pg import EmbeddedPostgres
from devtools.roles import ensure_logins
from devtools.sqlconn import connect
from jobfence.store.migrations import migrate

INSTALLATION = "jobfence"


def start(port: int, logs: Path, *, pods_reach: str | None = None,
          pods_network: str | None = None) -> dict[str, Any]:
    """The server on 127.0.0.1 and, for a real node's pods, also on ``pods_reach`` (the
    bridge's address), trusting ``pods_network``; the role Secrets' URLs name the address
    the pods reach."""
    pg = EmbeddedPostgres(port=port,
                          listen=("127.0.0.1", *((pods_reach,) if pods_reach else ())),
                          trust=(pods_network,) if pods_network else ())
    pg.start()
    atexit.unregister(pg.destroy)  # it belongs to the cluster now, not to this process
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as admin:
            admin.execute('CREATE DATABASE "jobfence"')
        url = pg.url("jobfence")
        conn = connect(url)
        try:
            migrate(conn, installation=INSTALLATION)
        finally:
            conn.close()
        urls = ensure_logins(url)
        if pods_reach:
            urls = {kind: make_conninfo(u, host=pods_reach) for kind, u in urls.items()}
    except BaseException:
        pg.destroy()
        raise
    return {"root": str(pg.root), "data": str(pg.data), "bindir": str(pg.bindir),
            "port": port, "url": url, "urls": urls, "run_as": pg._run_as}


def stop(info: dict[str, Any]) -> None:
    pg_ctl = Path(info["bindir"]) / "pg_ctl"
    if Path(info["data"]).exists():
        subprocess.run([str(pg_ctl), "-D", info["data"], "-m", "immediate", "-w", "-t", "30",
                        "stop"], capture_output=True, check=False, cwd=info["root"],
                       **info.get("run_as", {}))
    shutil.rmtree(info["root"], ignore_errors=True)
