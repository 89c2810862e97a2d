"""Drain mode: quiesce an installation for an upgrade or an incident. While it is on,
enqueue is refused, no claim is made, the KEDA trigger reads 0, and running jobs finish."""

from __future__ import annotations

import secrets

from jobfence.errors import ConfigError, Drained, NotMigrated
from jobfence.store.base import Noun
from jobfence.store.types import Connections, DrainState, Identity


class Control(Noun):
    sql_file = "control.sql"

    def durability(self) -> list[str]:
        """What in this server's replication setup may lose an acknowledged commit (empty:
        nothing seen). Read at ``migrate`` and at a worker's start, to be warned of: a
        managed service's synchronous standby may not show here, so never an error."""
        row = self._one("durability")
        if row is None:
            return []
        found = []
        if row["synchronous_commit"] in ("off", "local"):
            found.append(f"synchronous_commit is {row['synchronous_commit']}: a commit is "
                         "acknowledged before it is safe on disk or on a standby, and a "
                         "crash or failover may lose it (a job then runs again)")
        if int(row["replicas"]) > 0 and not row["synchronous_standby_names"].strip():
            found.append(f"{row['replicas']} replica(s) stream from this server "
                         "asynchronously (synchronous_standby_names is empty): a failover "
                         "may lose acknowledged commits. Keep the promise with a synchronous "
                         "standby (Patroni synchronous_mode_strict, CloudNativePG "
                         "dataDurability: required): docs/OPERATIONS.md")
        return found

    def drain_status(self) -> DrainState:
        state = self._row("drain_status", None, DrainState)
        assert state is not None, "jobfence_control holds one row from migration 0001 on"
        return state

    def drain_lock(self) -> None:
        """Inside an enqueue's transaction: wait for a `drain on` under way, then refuse
        if it is on (``Drained``); holds a share lock so `drain on` waits for this enqueue."""
        row = self._one("drain_lock")
        if row and row["draining"]:
            raise Drained("drain mode is on: enqueue is refused until `drain off`")

    def set_drain(self, *, on: bool, reason: str | None = None,
                  actor: str | None = None) -> DrainState:
        """Switch drain mode, recorded with ``actor`` (who asked) in ``control_events``."""
        state = self._row("set_drain", {"draining": on, "reason": reason, "actor": actor},
                          DrainState)
        assert state is not None
        return state

    def identity(self, configured: str | None = None) -> Identity:
        """This installation's identity. ``configured`` (JOBFENCE_INSTALLATION, when the
        deployment sets it) must be the database's: a worker or a pass of another
        installation must never act on this one's pods or objects."""
        found = self._row("identity", None, Identity)
        if found is None or found.installation is None:
            raise NotMigrated("the database has no installation identity yet: run "
                              "`jobfence migrate`")
        if configured is not None and configured != found.installation:
            raise ConfigError(
                f"JOBFENCE_INSTALLATION is {configured!r} but this database belongs to "
                f"installation {found.installation!r}: a deployment of one installation "
                "is pointed at another's database")
        return found

    def claim_identity(self, configured: str | None) -> Identity:
        """Fill in the identity at the first migrate (``configured``, or a generated name);
        afterwards check ``configured`` against it."""
        proposed = configured or f"jf-{secrets.token_hex(6)}"
        found = self._row("claim_identity", {"installation": proposed}, Identity)
        assert found is not None
        return self.identity(configured)

    def schema_version(self) -> int:
        """The newest migration applied."""
        row = self._one("schema_version")
        return int(row["version"]) if row and row["version"] is not None else 0

    def running_count(self) -> int:
        """Live claims: how many jobs still run (what drain waits for)."""
        row = self._one("running_count")
        return int(row["n"]) if row else 0

    def connections(self) -> Connections:
        """The server's client connections in use, against what it allows."""
        found = self._row("connections", None, Connections)
        assert found is not None
        return found
