"""The settings of a job's ``command`` children: who they run as, what of the worker's
environment they get, where they run, where their output goes and what stops them — a
section of ``jobfence.settings.Settings`` (which inherits it), kept here to keep each
module readable."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from jobfence.durations import Duration
from jobfence.jobuids import DEFAULT_UIDS, parse_uids

MIB = 1024 * 1024


class CommandSettings(BaseSettings):
    # -- a job's commands -------------------------------------------------------------------------

    command_user: str | None = Field(default=None, max_length=64)
    """Who a ``command`` child runs as when the worker runs as root without the command
    sidecar. Unset: a uid of its own per running job, from ``JOBFENCE_COMMAND_UIDS``, so that
    jobs sharing a machine cannot read each other's environment, signal each other or write
    into each other's files. A name or ``UID[:GID]``: that one user for every job — jobs
    then share it, and a job can read another running job's ``/proc/PID/environ`` (its
    ``env`` secrets), signal its processes and write into its directories. ``worker`` keeps
    the worker's own user (for a worker that is not root, the only choice)."""

    command_uids: str = Field(default=DEFAULT_UIDS, pattern=r"^\d{4,10}-\d{4,10}$")
    """The uids (``FIRST-LAST``) a root worker, or a root command sidecar, gives its jobs
    one each, unique across every worker and installation on the machine (a lock file per
    uid in ``/run/jobfence-uids``). The default is above the ranges that distributions,
    systemd and container runtimes hand out and below 2^31; a uid that has an entry in the
    user or group database is skipped."""

    command_env: str = Field(default="", max_length=4096)
    """Comma-separated names of the worker's own environment variables that a ``command``
    child also gets. Nothing else of the worker's environment reaches it."""

    command_socket: Path | None = None
    """Where the worker listens for its command sidecar (``jobfence command-runner``, a
    second container of the worker's pod that holds no Secret), in a directory only the
    worker's user may write: when set, every ``command`` child runs there, not as the
    worker's own child. The shipped worker pods set it."""

    command_runner_uid: int | None = Field(default=None, ge=0, le=0xFFFFFFFE)
    """The uid the command sidecar runs as: the worker takes the sidecar's connection only
    from it (``SO_PEERCRED``). Unset: only from root or the worker's own uid. The shipped
    worker pods set it to the sidecar's ``runAsUser``."""

    # -- a command's output and usage ----------------------------------------------------------

    output_lines_per_second: float = Field(default=200.0, ge=0, le=100_000)
    """Lines of its jobs' output a worker writes to its own log per second (all its jobs
    together, each a JSON line with the job, attempt, action and stream), so that the
    cluster's log shipping keeps them while a chatty job cannot drown the worker's own
    lines: past it lines are dropped, and one ``output_lines_dropped`` line a second says
    how many. 0: none. Written at level info."""

    output_max_bytes: int = Field(default=1024 * MIB, ge=0, le=1024 * 1024 * MIB)
    """How much of each stream (stdout, stderr) of one action goes to S3 when a bucket is
    configured; past it the stream is cut there (``output_truncated`` in the result) while
    its tail is still kept. 0: no output goes to S3 (the tails and the log lines stay)."""

    inactivity_timeout: Duration | None = None
    """For an action whose spec sets none: how long it may go without writing output (or,
    for a plugin action, reporting progress) before it is stopped and its attempt ends as
    ``inactive`` — retried or failed like a run timeout. Unset: no such limit."""

    usage_sample_seconds: float = Field(default=0.5, ge=0, le=60)
    """How often the resident memory of a command's whole process tree is sampled for its
    peak (``usage.peak_memory_bytes``; the command's own high-water mark is read at each
    poll besides). 0: nothing is read while it runs — the peak is then known only where a
    process of the tree outgrew the worker's own image. The CPU time comes from the kernel
    at the command's exit whatever this says."""

    @field_validator("command_uids")
    @classmethod
    def _uids(cls, value: str) -> str:
        parse_uids(value)
        return value
