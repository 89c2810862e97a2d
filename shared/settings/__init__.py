"""Settings from the environment (prefix ``JOBFENCE_``), validated at construction.

Each field says its unit and why its default is what it is; fields are grouped by section
(``# --`` comments, the sections of docs/REFERENCE.md's table). A CLI flag may override a field;
functions build ``Settings`` once in ``main()`` and pass it down.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Literal, Self

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from jobfence.durations import Duration
from jobfence.errors import ConfigError
from jobfence.ids import default_worker_id
from jobfence.limits import Unstorable, check_text, schema_refusal
from jobfence.settings.commands import CommandSettings

if TYPE_CHECKING:
    from jobfence.store.types import RetryPolicy


def self_fence_margin(lease_seconds: float) -> float:
    """How long before the local lease deadline a worker gives up: enough to kill the child
    and stop writing, small against the lease."""
    return max(0.2, min(5.0, lease_seconds * 0.1))


class Settings(CommandSettings):
    model_config = SettingsConfigDict(env_prefix="JOBFENCE_", extra="ignore", frozen=True,
                                      env_ignore_empty=True)

    # -- the database and the installation --------------------------------------------------------

    database_url: str = Field(min_length=1, repr=False)
    """PostgreSQL DSN (URL or key=value). Required: the database is the source of truth."""

    schema_name: str = Field(default="jobfence", pattern=r"^[a-z_][a-z0-9_]{0,47}$",
                             validation_alias=AliasChoices("JOBFENCE_SCHEMA", "schema_name"))
    """The PostgreSQL schema holding every jobfence object (tables, functions, types),
    created by ``jobfence migrate``; nothing goes to ``public``. Two installations can share
    a database with two schemas. A plain lower-case identifier of at most 48 characters, so
    that the role names made from it (``<schema>_maintainer``) fit PostgreSQL's limit; never
    ``public``, ``information_schema``, ``pg_*``, or an existing schema jobfence did not
    create (``migrate`` refuses it: exit 2, nothing written)."""

    installation: str | None = Field(default=None,
                                     pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
    """This installation's identity (a DNS label, at most 40 characters), as the deployment
    knows it: the label on its worker pods, the prefix of its objects. The database keeps
    the identity it was first migrated with; a function whose setting differs refuses to
    run (exit 2) rather than act on another installation's pods or objects. Unset: the
    database's (local workers without it are never signalled by orphan-cleanup)."""

    database_pooler: Literal["none", "session", "transaction"] = "none"
    """What sits between jobfence and PostgreSQL: nothing (``none``), a pooler lending a
    server connection per client session (``session``), or one lending it per transaction
    (``transaction``, PgBouncer's transaction pooling). In transaction mode jobfence
    prepares no statement on the server and keeps no session state between transactions
    (``wait`` polls instead of listening)."""

    connect_timeout_seconds: float = Field(default=5.0, gt=0, le=600)
    """How long to wait for a database connection before reporting it unavailable (exit 4).
    Short, because every function is a short-lived pod that the scheduler will run again."""

    # -- jobs: attempts and retries ---------------------------------------------------------------

    max_attempts: int = Field(default=3, ge=1, le=1000)
    """Default attempts per job when a spec does not say."""

    retry_base_seconds: float = Field(default=10.0, ge=0, le=86_400)
    """First retry delay; doubles per attempt, with jitter."""

    retry_max_seconds: float = Field(default=3600.0, ge=0, le=30 * 86_400)
    """Cap of the retry delay, so a job with many attempts still comes back within an hour."""

    max_interruptions: int = Field(default=10, ge=0, le=1000)
    """SIGTERMs (an eviction, a node drain, a deploy) a job may take without spending an
    attempt: the worker gives the job back at once and the attempt does not count. Past
    this many, a SIGTERM counts as a failed attempt, so that a job that is always
    interrupted still ends."""

    max_snoozes: int = Field(default=100, ge=0, le=1_000_000)
    """Snoozes a job may take (an action asking to run again later, which spends no
    attempt): past this many, the next one fails the job, saying so, so that a job cannot
    snooze forever unnoticed. 0: an action may not snooze."""

    # -- the worker -------------------------------------------------------------------------------

    queue: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    """The queue a worker serves when it is not given ``--queue`` (a pool's pods are)."""
    worker_concurrency: int = Field(default=1, ge=1, le=1000)
    """Jobs a worker runs at once without ``--concurrency``, each with its own claim, fence,
    lease and children. 1: one at a time; more for I/O-bound jobs in a draining pool."""

    worker_id: str | None = None
    """Claimer identity written on every claim; default the pod name from the downward API
    (``POD_NAME``), so that reconciliation can match a claim to its pod; else host:pid."""

    lease_seconds: float = Field(default=120.0, ge=1, le=86_400)
    """Claim lease. A worker that cannot renew it within this time stops its work; the
    sweeper reclaims the job once it has run out. Two minutes keeps a lost job's wait short
    while tolerating a database failover (typically well under a minute). At least a second:
    a shorter lease leaves no time to renew before the worker must fence itself."""

    heartbeat_seconds: float | None = Field(default=None, gt=0)
    """Lease renewal period; default a quarter of the lease, so three renewals can fail
    before the worker has to give up. At most half of what is left of the lease once its
    self-fencing margin is taken off, so that one renewal may fail without the worker
    stopping its job."""

    stop_check_seconds: float = Field(default=0.5, ge=0.05, le=60)
    """How often a running job's worker asks the database whether its attempt still holds
    the fence (a cheap read of one row): a cancel, or a timeout enforced by lifecycle,
    reaches the command within this. Where the connection can LISTEN (no transaction
    pooler) the worker is also told at once, and asks only every 10th of these."""

    # -- the periodic functions -------------------------------------------------------------------

    function_lease_seconds: float = Field(default=30.0, ge=3, le=3600)
    """The lease that lets one run of a periodic function at a time: renewed every third of
    it while the pass runs; a pass that was killed holds its function for at most this long
    (the next run after it takes over and records the killed one as abandoned)."""

    batch_size: int = Field(default=500, ge=1, le=100_000)
    """Rows per batch in every periodic pass: bounds each transaction and the memory of a
    pass, whatever the size of the table."""

    trigger: Literal["auto", "scheduled", "manual"] = "auto"
    """How a function run records its trigger. ``auto``: in a pod of a Job, ``scheduled`` when
    the Job's name is the CronJob controller's for a tick, else ``manual`` (``job_name``);
    ``manual`` whenever ``triggered_by`` is set; outside a pod ``manual`` when run from a
    terminal. Read from the environment only: a function needs no access to the Kubernetes
    API to know it (least privilege)."""

    job_name: str | None = Field(default=None, max_length=253)
    """The Kubernetes Job this pod belongs to (the downward API gives its label
    ``batch.kubernetes.io/job-name``; the shipped CronJobs set it). A Job the CronJob
    controller made for a tick is named ``<cronjob>-<minutes since 1970>`` for its scheduled
    time; any other name (``kubectl create job --from=cronjob/... once``) makes the run
    ``manual`` — read from the pod's own labels, with no access to the API."""

    triggered_by: str | None = Field(default=None, max_length=200)
    """Who started a function run by hand (recorded with the run, shown by ``jobfence
    runs``); setting it makes the run ``manual``."""

    trigger_reason: str | None = Field(default=None, max_length=2000)
    """Why a function run was started by hand (recorded with the run)."""

    # -- retention --------------------------------------------------------------------------------

    retention_default: Duration = timedelta(days=30)
    """How long a finished job without a ``ttl`` of its own is kept (rows and S3 outputs),
    as an ISO 8601 duration (``P30D``, ``PT36H``). A month leaves time to look into a
    failure and to collect outputs, without the table growing forever."""

    audit_retention: Duration = timedelta(days=90)
    """How long audit events (``job_events``) are kept, as an ISO 8601 duration. Longer
    than job retention on purpose: the trail of a deleted job still answers "what happened
    to it" for a quarter. A workflow is deleted once it is older than this and retention has
    deleted all its steps (lifecycle's ``workflows_deleted``)."""

    function_runs_retention: Duration = timedelta(days=30)
    """How long records of periodic function runs (``function_runs``) and of their manual
    triggers (``function_triggers``) are kept, as an ISO 8601 duration. A run every minute
    is ~43k rows a month per function: enough history to see when a pass last succeeded,
    bounded."""

    # -- the cluster ------------------------------------------------------------------------------

    cluster: Literal["kubernetes", "local", "none"] = "none"
    """Where worker pods live: the Kubernetes API, processes on this machine, or nowhere
    (reconciliation and pod clean-up then have nothing to compare against)."""

    namespace: str = "default"
    """Namespace of the worker pods."""

    worker_selector: str = "app.kubernetes.io/name=jobfence,app.kubernetes.io/component=worker"
    """Label selector of worker pods (manifests/ labels the ScaledJob's pod template so)."""

    kube_qps: float = Field(default=20.0, gt=0, le=10_000)
    """Client-side rate limit on Kubernetes API calls (bursts up to twice this): a pass over
    thousands of pods must not crowd out the control plane."""

    kube_page_size: int = Field(default=500, ge=1, le=5000)
    """Pods per list page (``limit``/``continue``): bounds a pass's memory."""

    reconcile_grace_seconds: float = Field(default=15.0, ge=0, le=86_400)
    """Claims younger than this at the start of the pod listing are not judged. The listing
    starts after that instant and a claim is made by a live pod, so the comparison is sound
    without it; the margin absorbs an API server answering from a slightly stale view."""

    orphan_pod_grace_seconds: float = Field(default=180.0, ge=0, le=30 * 86_400)
    """A running worker pod must hold no live claim for this long, seen by two passes at
    least this far apart, before orphan-cleanup deletes it. A healthy worker is without a
    claim only while it starts (seconds) and exits; a frozen one whose claim was reclaimed
    still counts as a running Job to KEDA and holds a slot until it is deleted."""

    finished_pod_history: int = Field(default=100, ge=0)
    """Finished worker pods kept for their logs (KEDA's own default history); older ones are
    deleted with their Jobs."""

    # -- the object store -------------------------------------------------------------------------

    s3_endpoint_url: str | None = None
    """Object store endpoint (unset: AWS's own)."""

    s3_bucket: str | None = None
    """Bucket for outputs and manifests (under the ``jobfence/`` prefix)."""

    s3_region: str = "us-east-1"
    """Region for the object store client."""

    s3_access_key_id: str | None = None
    """Object store credentials; unset: boto3's own chain (environment, IRSA, instance
    profile), which is what a pod on EKS should use."""

    s3_secret_access_key: str | None = Field(default=None, repr=False)
    """Secret for ``s3_access_key_id``; never logged."""

    orphan_object_grace_seconds: float = Field(default=3600.0, ge=0, le=365 * 86_400)
    """S3 objects of fenced-out or failed attempts, or of deleted jobs, are deleted once
    they are older than this: long enough that no upload of a live attempt is in flight."""

    # -- metrics and logs -------------------------------------------------------------------------

    pushgateway_url: str | None = None
    """Prometheus Pushgateway for run metrics; unset: nothing is pushed."""

    push_queue_metrics: bool = True
    """Whether each pass also pushes the queue and job metrics (group ``function="queue"``).
    The metrics exporter component turns it off: it serves them itself, read on each
    scrape, and the same series from two sources would count twice."""

    log_format: Literal["json", "console"] = "json"
    """Log lines on stderr: JSON for machines, console for people."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""

    tracing: Literal["auto", "on", "off"] = "auto"
    """OpenTelemetry traces (the extra `jobfence[otel]`; REFERENCE.md, "Traces"): `auto` when
    the OTEL_* variables name an exporter (and `OTEL_SDK_DISABLED` is not true); `on` always
    (default OTLP endpoint), refusing to start without the extra; `off` never imports it."""

    tracing_flush_seconds: float = Field(default=5.0, ge=0, le=300)
    """How long a function waits at its exit for its last spans to be exported: bounded, so
    that a collector that does not answer never holds a pod's end for long."""

    # -- the console and the HTTP API (`jobfence serve`) ------------------------------------------

    auth: Literal["tokenreview", "proxy", "none"] = "tokenreview"
    """How ``jobfence serve`` knows who calls it: ``tokenreview`` (a bearer token, checked by
    the Kubernetes API's TokenReview), ``proxy`` (the identity headers an authenticating
    proxy in front sets; only the proxy may reach the server) or ``none`` (everyone is an
    operator: refused unless the server listens on a loopback address, for local use)."""

    auth_readers: str = Field(default="*", max_length=4096)
    """Who may read through ``jobfence serve``: comma-separated user names, ``group:NAME``
    for a group's members, ``*`` for anyone authenticated. Operators may read too. A user
    and a group never match each other: a user named ``group:ops`` is not in ``ops`` (list
    such a user as ``user:group:ops``)."""

    auth_operators: str = Field(default="", max_length=4096)
    """Who may act through ``jobfence serve`` (submit, cancel, retry, pause, drain,
    trigger), in the form of ``JOBFENCE_AUTH_READERS``. Empty: nobody."""

    auth_proxy_user_header: str = Field(default="X-Forwarded-User", min_length=1,
                                        max_length=100)
    """With ``JOBFENCE_AUTH=proxy``: the header holding the user's name."""

    auth_proxy_groups_header: str = Field(default="X-Forwarded-Groups", min_length=1,
                                          max_length=100)
    """With ``JOBFENCE_AUTH=proxy``: the header holding the user's groups (comma-separated)."""

    reader_database_url: str | None = Field(default=None, repr=False)
    """``jobfence serve``: a login of the reader role, for every request that only reads
    (then the database itself refuses a write on a reader's behalf). Unset: the server's own
    login (``JOBFENCE_DATABASE_URL``, the operator's) reads too."""

    serve_connections: int = Field(default=4, ge=1, le=100)
    """Database connections ``jobfence serve`` keeps at most (its share of the budget)."""

    trigger_interval_seconds: float = Field(default=60.0, ge=0, le=86_400)
    """The least time between two manual triggers of one periodic function (all console
    replicas together)."""

    @field_validator("schema_name")
    @classmethod
    def _schema(cls, value: str) -> str:
        if (why := schema_refusal(value)) is not None:
            raise ValueError(why)
        return value

    @field_validator("database_url", "reader_database_url")
    @classmethod
    def _dsn(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from jobfence.db import check_dsn

        try:
            check_text(value, "value")
        except Unstorable:
            raise ValueError("is not valid UTF-8 text") from None
        check_dsn(value)  # never echoes the value: it may hold a password
        return value

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: object) -> object:
        """Settings come from the environment, which may hold bytes that are not UTF-8."""
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, str) and not key.endswith("database_url"):
                    check_text(value, f"JOBFENCE_{key.upper()}")
        return data

    @model_validator(mode="after")
    def _defaults(self) -> Self:
        if self.heartbeat_seconds is None:
            object.__setattr__(self, "heartbeat_seconds", self.lease_seconds / 4)
        else:
            most = (self.lease_seconds - self_fence_margin(self.lease_seconds)) / 2
            if self.heartbeat_seconds > most:
                raise ValueError(
                    f"JOBFENCE_HEARTBEAT_SECONDS must be at most {most:g} with a "
                    f"JOBFENCE_LEASE_SECONDS of {self.lease_seconds:g} (half of the lease "
                    "minus its self-fencing margin), so that a renewal may fail once before "
                    "the worker stops")
        if self.worker_id is None:
            object.__setattr__(self, "worker_id",
                               default_worker_id(self.cluster, self.installation))
        return self

    @property
    def heartbeat(self) -> float:
        assert self.heartbeat_seconds is not None
        return self.heartbeat_seconds

    @property
    def retry_policy(self) -> RetryPolicy:
        """The retry delay every reclaim and every failed attempt uses: base
        ``retry_base_seconds``, doubling, capped at ``retry_max_seconds``."""
        from jobfence.store.types import RetryPolicy

        return RetryPolicy(self.retry_base_seconds, self.retry_max_seconds)

    @property
    def can_listen(self) -> bool:
        """Whether a connection keeps its session, so that LISTEN works: not behind a
        transaction pooler, where the next statement may run on another server
        connection."""
        return self.database_pooler != "transaction"

    @property
    def worker(self) -> str:
        assert self.worker_id is not None
        return self.worker_id


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment plus CLI overrides; a clear ConfigError if invalid."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            env = ("" if field == "settings" else f"{field} " if field.startswith("JOBFENCE_")
                   else f"JOBFENCE_{field.upper()} ")
            required = err["type"] == "missing" or (
                field == "database_url" and err["type"] == "string_too_short")
            msg = "is required" if required else err["msg"].removeprefix("Value error, ")
            problems.append(f"{env}{msg}")
        raise ConfigError("; ".join(problems)) from None
