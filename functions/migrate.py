"""migrate: apply the database migrations (idempotent; safe to run from several pods at
once), create the installation's group roles when this login may, and grant each its
privileges; ``--roles-sql`` prints the SQL a DBA runs to create the roles when it may not."""

from __future__ import annotations

import sys

from jobfence import cli
from jobfence.db import connect
from jobfence.store import Store
from jobfence.store.migrations import migrate
from jobfence.store.roles import connection_identity, setup_sql


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence migrate", description="Apply database migrations "
                       "(idempotent; safe to run from several pods at once), create the "
                       "installation's group roles when this login may, and grant each "
                       "its privileges.")
        p.add_argument("--roles-sql", action="store_true",
                       help="print the SQL a DBA runs to create the group roles when this "
                       "login may not, and change nothing")
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        settings = cli.setup("migrate")
        conn = connect(settings.database_url, pooler=settings.database_pooler,
                       application_name="jobfence-migrate",
                       connect_timeout=settings.connect_timeout_seconds)
        try:
            if args.roles_sql:
                login, database = connection_identity(conn)
                sys.stdout.write(setup_sql(settings.schema_name, login, database))
                return 0
            report = migrate(conn, settings.schema_name, settings.installation)
            durability = Store(conn, settings.schema_name).control.durability()
        finally:
            conn.close()
        roles = report.roles
        out: dict[str, object] = {"function": "migrate", "schema": settings.schema_name,
                                  "installation": report.installation,
                                  "applied": list(report.applied), "version": report.current,
                                  "functions": list(report.functions),
                                  "roles": {"created": list(roles.created),
                                            "missing": list(roles.missing),
                                            "granted": roles.granted, "owner": roles.owner}}
        if report.relocated_from:
            out["moved_from_schema"] = report.relocated_from
        if roles.missing:
            cli.warn(f"roles {', '.join(roles.missing)} do not exist and this login may not "
                     "create them: nothing was granted, and every function needs this "
                     "login's privileges. Have a DBA run the SQL of `jobfence migrate "
                     "--roles-sql`, then run `jobfence migrate` again.")
        for why in durability:
            cli.warn(why)
        cli.emit(out)
        return 0

    return cli.run_command("migrate", body)


if __name__ == "__main__":
    sys.exit(main())
