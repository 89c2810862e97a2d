"""The settings' section on a job's ``command`` children: who they run as, what of the
worker's environment they get (never its credentials: the refusals here are also the
worker's check of what it hands on), where they run, where their output goes and what stops
them. ``jobfence.settings.Settings`` is made of this section and its own fields."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings

from jobfence.durations import Duration
from jobfence.jobuids import DEFAULT_UIDS, parse_uids, resolve_user

MIB = 1024 * 1024

CREDENTIAL_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCP_", "VAULT_", "OTEL_EXPORTER_OTLP_")
"""Names a ``command`` child never gets from the worker's environment, by prefix: cloud
credentials (boto3 reads ``AWS_*``: the worker's S3 keys), a secret store's token, and the
OpenTelemetry exporter's settings (their headers carry its token). ``JOBFENCE_*`` (the
worker's own settings, the database URL among them) are refused besides."""

CREDENTIAL_NAMES = frozenset({
    "DATABASE_URL", "PGPASSWORD", "PGPASSFILE", "PGSERVICE", "PGSERVICEFILE", "PGSSLKEY",
    "PGSSLPASSWORD", "PGUSER", "PGHOST", "PGDATABASE", "KUBECONFIG",
    "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "POD_NAME", "SSH_AUTH_SOCK",
    "GITHUB_TOKEN", "GH_TOKEN", "NPM_TOKEN", "DOCKER_CONFIG", "REGISTRY_AUTH_FILE",
    "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"})
"""Names a ``command`` child never gets from the worker's environment, exactly: libpq's
connection settings (a password, a password or service file, a key), the Kubernetes API's
address and kubeconfig, an SSH agent, well-known tokens, proxies (their URLs may carry
credentials). Compared in upper case."""

_CREDENTIAL_UPPER = frozenset(n.upper() for n in CREDENTIAL_NAMES)


def command_env_refusal(names: str) -> str | None:
    """Why ``JOBFENCE_COMMAND_ENV`` may not pass these names to every job's command (None:
    it may): jobfence's own settings and the worker's credentials stay the worker's."""
    refused = [n for n in (x.strip() for x in names.split(",")) if n
               and (n.upper().startswith(("JOBFENCE_", *CREDENTIAL_PREFIXES))
                    or n.upper() in _CREDENTIAL_UPPER)]
    if not refused:
        return None
    return (f"JOBFENCE_COMMAND_ENV would hand every job's command the worker's own settings or "
            f"credentials: {', '.join(refused)} (jobfence's settings JOBFENCE_*, and the names "
            f"docs/REFERENCE.md lists, are never passed; give a job what it needs in its spec's "
            f"env, or set JOBFENCE_COMMAND_ENV_ALLOW_SECRETS=true to hand them on regardless)")


def command_user_refusal(user: str | None) -> str | None:
    """Why ``JOBFENCE_COMMAND_USER`` may not be this user (None: it may): uid 0 would run
    every job's command as root, able to read the worker's environment and everything else."""
    if user is None or user.strip() == "worker":
        return None
    text = user.strip()
    try:
        uid = resolve_user(text)[0]
    except ValueError:
        return None  # not a user here: refused where the worker resolves it
    if uid != 0:
        return None
    return (f"JOBFENCE_COMMAND_USER={user!r} is uid 0: every job's command would run as root, "
            f"able to read the worker's environment (its database URL and keys) and to "
            f"signal or trace it; unset it (a uid of its own per job) or name an ordinary user")


class CommandSettings(BaseSettings):
    # -- a job's commands -------------------------------------------------------------------------

    command_user: str | None = Field(default=None, max_length=64)
    """Who a ``command`` child runs as when the worker runs as root without the command
    sidecar. Unset: a uid of its own per running job, from ``JOBFENCE_COMMAND_UIDS``, so that
    jobs sharing a machine cannot read each other's environment, signal each other or write
    into each other's files. A name or ``UID[:GID]``: that one user for every job — jobs
    then share it, and a job can read another running job's ``/proc/PID/environ`` (its
    ``env`` secrets), signal its processes and write into its directories. ``worker`` keeps
    the worker's own user (for a worker that is not root, the only choice). Never uid 0
    (``0``, ``root``, a name that is uid 0 here): refused (exit 2)."""

    command_uids: str = Field(default=DEFAULT_UIDS, pattern=r"^\d{4,10}-\d{4,10}$")
    """The uids (``FIRST-LAST``) a root worker, or a root command sidecar, gives its jobs
    one each, unique across every worker and installation on the machine (a lock file per
    uid in ``/run/jobfence-uids``). The default is above the ranges that distributions,
    systemd and container runtimes hand out and below 2^31; a uid that has an entry in the
    user or group database is skipped."""

    command_env: str = Field(default="", max_length=4096)
    """Comma-separated names of the worker's own environment variables that a ``command``
    child also gets. Nothing else of the worker's environment reaches it. Never jobfence's
    own settings (``JOBFENCE_*``) nor a well-known credential (``AWS_*``, ``AZURE_*``,
    ``GOOGLE_*``, ``GCP_*``, ``VAULT_*``, ``OTEL_EXPORTER_OTLP_*``, ``DATABASE_URL``,
    libpq's ``PGPASSWORD``, ``PGPASSFILE``, ``PGSERVICE``, ``PGSERVICEFILE``, ``PGSSLKEY``,
    ``PGSSLPASSWORD``, ``PGUSER``, ``PGHOST``, ``PGDATABASE``, ``KUBECONFIG``,
    ``KUBERNETES_SERVICE_HOST``/``PORT``, ``POD_NAME``, ``SSH_AUTH_SOCK``, ``GITHUB_TOKEN``,
    ``GH_TOKEN``, ``NPM_TOKEN``, ``DOCKER_CONFIG``, ``REGISTRY_AUTH_FILE``, the proxies):
    such a list is refused (exit 2) unless ``JOBFENCE_COMMAND_ENV_ALLOW_SECRETS`` says
    otherwise."""

    command_env_allow_secrets: bool = False
    """Lets ``JOBFENCE_COMMAND_ENV`` name jobfence's own settings and the credentials it
    otherwise refuses, for a deployment that means to hand them to every job (the worker's
    role still bounds what a job can do with the database URL). Loud: every worker that
    starts with such a name logs ``command_env_unsafe`` (level warning) naming them."""

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

    @field_validator("command_user")
    @classmethod
    def _not_root(cls, value: str | None) -> str | None:
        if (why := command_user_refusal(value)) is not None:
            raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _no_credentials(self) -> Self:
        if not self.command_env_allow_secrets and \
                (why := command_env_refusal(self.command_env)) is not None:
            raise ValueError(why)
        return self
