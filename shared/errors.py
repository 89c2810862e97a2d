"""Typed errors, and the one table that maps them to the CLI's exit codes (docs/REFERENCE.md).

psycopg errors are translated in one place, ``jobfence.db.translate``; nothing else needs to
know what a ``UniqueViolation`` on a given index means.
"""

from __future__ import annotations

from datetime import datetime
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    INVALID = 2
    CONFLICT = 3
    UNAVAILABLE = 4
    NOT_FOUND = 5
    TIMEOUT = 7


class JobfenceError(Exception):
    """Base of every error jobfence raises on purpose."""

    exit_code: ExitCode = ExitCode.FAILED


class InvalidSpec(JobfenceError):
    """The input is wrong; nothing was written."""

    exit_code = ExitCode.INVALID


class TooLarge(InvalidSpec):
    """The input is larger than jobfence reads (an HTTP body: 413); nothing was written."""


class ConfigError(InvalidSpec):
    """A setting is missing or malformed."""


class Conflict(JobfenceError):
    """The request contradicts the current state."""

    exit_code = ExitCode.CONFLICT


class ResourceBusy(Conflict):
    """Another active job holds the resource."""

    def __init__(self, resource: str | None) -> None:
        self.resource = resource
        what = f"resource {resource!r}" if resource else "a resource"
        super().__init__(f"{what} is held by another active job")


class JobAlreadyTerminal(Conflict):
    """The job has already finished; terminal states never change."""


class NotRetryable(Conflict):
    """Only a failed or cancelled job (not a parent) can be retried."""


class IdempotencyConflict(Conflict):
    """An idempotency key was reused with a different spec."""


class Unavailable(JobfenceError):
    """The service cannot take the request right now."""

    exit_code = ExitCode.UNAVAILABLE


class Drained(Unavailable):
    """Drain mode is on: no new work is accepted."""


class StoreUnavailable(Unavailable):
    """The database cannot be reached."""


class NoFreeUid(Unavailable):
    """Every uid a job's command could run as here is held by a running job: this worker
    cannot run the job now. The job is not at fault — it is given back, its attempt not
    spent."""


class NotWriter(StoreUnavailable):
    """The server answered that it takes no writes (SQLSTATE 25006: a replica, a primary
    being demoted, or ``default_transaction_read_only``): what was sent did not commit.
    The connection is done for: a fresh one (a multi-host URL with
    ``target_session_attrs=read-write``, or a service that follows the primary) reaches
    the writer."""


class Unreplicated(StoreUnavailable):
    """A commit's wait for its synchronous standby was cut short (the server said so with a
    WARNING and reported success): it committed on that server but may not survive a
    failover. Its outcome is unknown until it is read back on the writer."""


class RateLimited(Conflict):
    """Asked again too soon (a manual trigger of a periodic function); ``retry_at`` is when
    it may be asked again, when known."""

    def __init__(self, message: str, retry_at: datetime | None = None) -> None:
        super().__init__(message)
        self.retry_at = retry_at


class Forbidden(JobfenceError):
    """The caller is known but may not do this (a reader asking an operator's verb)."""

    exit_code = ExitCode.INVALID


class Unauthenticated(JobfenceError):
    """The caller could not be identified (no token, a token the cluster does not know)."""

    exit_code = ExitCode.INVALID


class NotFound(JobfenceError):
    exit_code = ExitCode.NOT_FOUND


class JobNotFound(NotFound):
    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} not found")


class NotMigrated(ConfigError):
    """The database holds no jobfence schema, or one other than this release calls: older
    (run ``migrate``), or moved on by a newer release that dropped what this one calls."""

    def __init__(self, message: str, missing: str | None = None) -> None:
        super().__init__(message)
        self.missing = missing
        """What the database did not have (PostgreSQL's own words), when that was it."""


class StoreError(JobfenceError):
    """The database refused a statement for a reason of its own (not the input, not its
    availability): the operation failed."""


class ObjectStoreError(JobfenceError):
    """An object-store call failed after its retries. ``code`` is the store's error code
    when it gave one (``NoSuchBucket``, ``AccessDenied``...)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ClusterError(JobfenceError):
    """A cluster call failed after its retries, or a listing could not be completed: the
    pass that needed it changes nothing and fails (exit 1)."""


class PassInterrupted(JobfenceError):
    """A periodic pass stopped at a batch boundary: SIGTERM, or its lease was lost."""


class WaitTimeout(JobfenceError):
    exit_code = ExitCode.TIMEOUT


class FenceLost(JobfenceError):
    """A fenced write matched nothing: this attempt no longer owns the job."""

    def __init__(self, job_id: object, attempt_id: object, why: str = "") -> None:
        self.job_id = job_id
        self.attempt_id = attempt_id
        super().__init__(f"attempt {attempt_id} of job {job_id} lost its fence{why}")
