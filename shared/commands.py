"""The commands of ``jobfence``: each one's module in ``jobfence.functions`` and a line of
help. The dispatcher (``jobfence.functions.cli``) runs them; ``jobfence completion`` lists
them for the shells."""

from __future__ import annotations

# name -> (module in jobfence.functions:function, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "enqueue": ("enqueue:main", "validate and insert job(s), print their ids"),
    "worker": ("worker:main", "claim and run jobs under lease, heartbeat and fence"),
    "sweeper": ("sweeper:main", "expired leases: rotate fence, retry or fail"),
    "reconciliation": ("reconciliation:main",
                       "claims whose worker pod is gone or dead: rotate fence, retry or fail"),
    "orphan-cleanup": ("orphan_cleanup:main",
                       "delete worker pods and S3 objects that nothing owns"),
    "lifecycle": ("lifecycle:main",
                  "run timeouts, pending expiry, retention of finished jobs and history"),
    "export-finalize": ("export_finalize:main",
                        "finalize parents whose children are done; release dependents"),
    "schedules": ("schedules:main", "enqueue each due tick of the schedules, exactly once"),
    "migrate": ("migrate:main", "apply database migrations"),
    "status": ("status:main", "show one job"),
    "list": ("list:main", "list jobs"),
    "wait": ("wait:main", "block until a job is terminal"),
    "cancel": ("cancel:main",
               "cancel a job (and a parent's children), or a selection in bulk"),
    "retry": ("retry:main",
              "run a failed or cancelled job again (new attempts), or a selection in bulk"),
    "drain": ("drain:main", "drain mode on|off|status"),
    "info": ("info:main", "which installation this is (schema, identity, version)"),
    "queue": ("queue:main", "a queue's state; pause, resume or limit it; its groups"),
    "workflow": ("workflow:main", "a workflow's state and steps; list, cancel or retry"),
    "schedule": ("schedule:main", "schedules of your own work: add, list, show, pause, "
                 "resume, delete"),
    "pools": ("pools:main", "render the KEDA ScaledJobs of the worker pools"),
    "command-runner": ("command_runner:main",
                       "the worker pod's command sidecar: run jobs' commands away from the keys"),
    "metrics": ("metrics:main", "print the metrics (Prometheus text), or serve them"),
    "logs": ("logs:main", "a job's whole output (stdout, stderr), or --follow it"),
    "runs": ("runs:main", "recent runs of the periodic functions: trigger, status, counts"),
    "serve": ("serve:main", "the operators' web console and HTTP API"),
    "completion": ("completion:main", "shell completion: bash, zsh or fish"),
}
