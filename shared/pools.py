"""Worker pools: each kind of work in its own queue, served by its own pods.

A pool is declared in a few lines (``manifests/pools.yaml``): its queue, the image its pods
run, their resources, how many at once, and whether each pod runs one job and exits or
keeps draining the queue within a budget. ``jobfence pools render`` turns each into a KEDA
ScaledJob from one template (``pool_template.yaml``: the restricted security context, the
downward API, the DSN from its Secret are the same for every pool) whose trigger query
counts only that pool's queue — the product's own query, ``Queues.scaler_query``, with the
queue filled in as a literal.
"""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from jobfence.limits import queue_name

POOL_NAME = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"


class Pool(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=POOL_NAME)
    """The pool's name (its ScaledJob is ``jobfence-worker-<name>``)."""
    queue: str = ""
    """The queue its workers serve (default: the pool's name)."""
    mode: Literal["one-per-pod", "draining"] = "one-per-pod"
    """``one-per-pod``: each pod claims one job and exits (long jobs, big pods).
    ``draining``: each pod claims until nothing is ready or its budget is spent (short
    jobs: a pod's start-up is paid once for many)."""
    max_pods: int = Field(default=20, ge=1, le=1000, alias="maxPods")
    max_jobs: int = Field(default=1000, ge=1, le=10_000_000, alias="maxJobs")
    """A draining pod's budget: jobs claimed before it exits."""
    max_seconds: int = Field(default=600, ge=1, le=7 * 86_400, alias="maxSeconds")
    """A draining pod's budget: no claim after this many seconds (the jobs in hand end)."""
    concurrency: int = Field(default=1, ge=1, le=1000)
    """Jobs a draining pod runs at once (``--concurrency``), each with its own claim, fence,
    lease and child processes: for I/O-bound work, one pod's start-up and connections
    serve many jobs. Its trigger then counts a pod's worth of work per ``concurrency``
    claims (``targetQueryValue``). One-per-pod pools run one job: 1."""
    image: str = "jobfence"
    """A team's own image built FROM the jobfence image (manifests/README.md); both the
    worker and the command sidecar run it."""
    resources: dict[str, Any] = Field(default_factory=lambda: {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"cpu": "2", "memory": "1Gi"}})
    """The command sidecar's requests and limits: the job's commands run in it."""
    polling_interval: int = Field(default=10, ge=1, le=3600, alias="pollingInterval")

    @field_validator("queue")
    @classmethod
    def _queue(cls, value: str) -> str:
        return queue_name(value) if value else value

    @model_validator(mode="after")
    def _default_queue(self) -> Pool:
        if not self.queue:
            object.__setattr__(self, "queue", queue_name(self.name))
        if self.mode == "one-per-pod" and self.concurrency != 1:
            raise ValueError(f"pool {self.name}: a pod of one job runs one job at a time "
                             "(concurrency 1); use mode: draining for more")
        return self

    @property
    def args(self) -> list[str]:
        if self.mode == "one-per-pod":
            return ["worker", "--queue", self.queue]
        args = ["worker", "--queue", self.queue, "--max-jobs", str(self.max_jobs),
                "--max-seconds", str(self.max_seconds)]
        return args + (["--concurrency", str(self.concurrency)] if self.concurrency > 1 else [])


class Pools(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_name: str = Field(default="jobfence", alias="schema",
                             pattern=r"^[a-z_][a-z0-9_]{0,47}$")
    """JOBFENCE_SCHEMA of the installation (the trigger queries name it)."""
    pools: list[Pool] = Field(min_length=1, max_length=200)

    @model_validator(mode="after")
    def _distinct(self) -> Pools:
        for what in ("name", "queue"):
            values = [getattr(p, what) for p in self.pools]
            if len(values) != len(set(values)):
                raise ValueError(f"two pools have the same {what}")
        return self


def template() -> dict[str, Any]:
    import yaml

    text = resources.files("jobfence").joinpath("pool_template.yaml").read_text("utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def scaled_job(pool: Pool, query: str, base: dict[str, Any]) -> dict[str, Any]:
    """The ScaledJob of ``pool`` from the template ``base``."""
    obj = copy.deepcopy(base)
    labels = {"app.kubernetes.io/component": "worker", "jobfence.io/pool": pool.name,
              "jobfence.io/queue": pool.queue}
    obj["metadata"] = {"name": f"jobfence-worker-{pool.name}", "labels": labels}
    spec = obj["spec"]
    spec["pollingInterval"] = pool.polling_interval
    spec["maxReplicaCount"] = pool.max_pods
    pod = spec["jobTargetRef"]["template"]
    pod["metadata"]["labels"].update({"jobfence.io/pool": pool.name,
                                      "jobfence.io/queue": pool.queue})
    [container] = pod["spec"]["containers"]
    container["image"] = pool.image
    container["args"] = pool.args
    [sidecar] = pod["spec"]["initContainers"]
    sidecar["image"] = pool.image  # the team's tools are where its commands run
    sidecar["resources"] = pool.resources
    [trigger] = spec["triggers"]
    trigger["name"] = f"queue-{pool.queue}"
    trigger["metadata"]["query"] = query
    # A pod is a pool's worth of work per `concurrency` claims (functions/pools.py says why).
    trigger["metadata"]["targetQueryValue"] = str(pool.concurrency)
    return obj
