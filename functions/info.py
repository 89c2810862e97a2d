"""info: which installation this is — its schema, its identity (the installation id and
when it was made), the schema version, and whether it is draining."""

from __future__ import annotations

import sys

from jobfence import cli


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence info", description="Which installation this is: its "
                       "schema, identity and schema version.")
        p.parse_args(list(sys.argv[1:] if argv is None else argv))
        settings = cli.setup("info")
        with cli.open_store(settings, "info") as store:
            identity = store.control.identity(settings.installation)
            state = store.control.drain_status()
            version = store.control.schema_version()
        cli.emit({"schema": settings.schema_name, "installation": identity.installation,
                  "identified_at": identity.identified_at, "schema_version": version,
                  "draining": state.draining})
        return 0

    return cli.run_command("info", body)


if __name__ == "__main__":
    sys.exit(main())
