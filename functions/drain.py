"""drain: quiesce an installation — ``on`` refuses new work and lets running jobs finish,
``off`` takes work again, ``status`` says which (audited with who and why); each prints the
state, the running jobs and the scaler's value."""

from __future__ import annotations

import sys

from jobfence import cli


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence drain", description="Quiesce: refuse new work, let "
                       "running jobs finish.")
        p.add_argument("mode", choices=["on", "off", "status"])
        p.add_argument("--reason")
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        settings = cli.setup("drain")
        with cli.open_store(settings, "drain") as store:
            if args.mode != "status":
                store.control.set_drain(on=args.mode == "on", reason=args.reason,
                                        actor=cli.actor())
            state = store.control.drain_status()
            running = store.control.running_count()
            scaler = store.queues.pending_total()
            identity = store.control.identity(settings.installation)
        cli.emit({"installation": identity.installation, "draining": state.draining,
                  "since": state.drain_changed_at, "reason": state.drain_reason,
                  "running": running, "scaler_value": scaler})
        return 0

    return cli.run_command("drain", body)


if __name__ == "__main__":
    sys.exit(main())
