"""A connection for the tests, the demo and the benchmarks to look into an installation's
tables with plain SQL (``SELECT * FROM jobs``): jobfence's own connection, with the
installation's schema first on the session's search path. jobfence itself never relies on
a search path — every statement it runs names its schema — so this is for inspection only.
"""

from __future__ import annotations

from jobfence import db
from jobfence.db import Connection


def connect(dsn: str, *, schema: str = "jobfence", **kwargs: object) -> Connection:
    """Nothing is prepared on the server, so that this also works through a transaction
    pooler (where the search path comes from the pooler's own ``connect_query``)."""
    conn = db.connect(dsn, pooler="transaction", **kwargs)  # type: ignore[arg-type]
    conn.execute("SELECT set_config('search_path', %s, false)", (f"{schema}, public",))
    return conn
