"""An in-memory cluster: pods in a dict, listed in pages, with failures on demand (a listing
that breaks part-way, deletes that fail) — for unit tests, and for integration tests beside
a real store."""

from __future__ import annotations

from collections.abc import Iterator

from jobfence.cluster import POD_NAME_PATTERN, ClusterError, Identity, Pod


class MemoryCluster:
    def __init__(self, pods: list[Pod] | None = None, *, page_size: int = 2,
                 claimer_pattern: str = POD_NAME_PATTERN) -> None:
        self.pods: dict[str, Pod] = {p.name: p for p in pods or []}
        self.jobs: dict[str, dict[str, str]] = {}
        self.job_uids: dict[str, str] = {}
        self.page_size = page_size
        self.claimer_pattern = claimer_pattern
        self.fail_listing_at_page: int | None = None
        self.fail_deletes: set[str] = set()
        self.deleted_pods: list[str] = []
        self.deleted_jobs: list[str] = []
        self.pages_served = 0
        self.triggered: list[dict[str, str]] = []
        self.fail_triggers = False
        self.tokens: dict[str, Identity] = {}

    def add(self, pod: Pod) -> None:
        self.pods[pod.name] = pod
        if pod.job_name:
            self.jobs.setdefault(pod.job_name, {})
            if pod.job_uid:
                self.job_uids[pod.job_name] = pod.job_uid

    def worker_pod_pages(self) -> Iterator[list[Pod]]:
        names = sorted(self.pods)
        for n, start in enumerate(range(0, max(len(names), 1), self.page_size)):
            if self.fail_listing_at_page is not None and n == self.fail_listing_at_page:
                raise ClusterError("listing worker pods failed: HTTP 500 (injected)")
            self.pages_served += 1
            yield [self.pods[name] for name in names[start:start + self.page_size]]

    def delete_pod(self, name: str, *, uid: str | None, grace_seconds: int) -> bool:
        if name in self.fail_deletes:
            raise ClusterError(f"deleting pod {name} failed: HTTP 500 (injected)")
        pod = self.pods.get(name)
        if pod is None or (uid is not None and pod.uid is not None and pod.uid != uid):
            return False  # gone, or another pod under the name: the precondition fails
        del self.pods[name]
        self.deleted_pods.append(name)
        return True

    def delete_job(self, name: str, *, uid: str | None, grace_seconds: int) -> bool:
        if name in self.fail_deletes:
            raise ClusterError(f"deleting job {name} failed: HTTP 500 (injected)")
        if name not in self.jobs or (uid is not None and self.job_uids.get(name, uid) != uid):
            return False  # gone, or another Job under the name: the precondition fails
        del self.jobs[name]
        self.job_uids.pop(name, None)
        self.deleted_jobs.append(name)
        for pod in [p for p in self.pods.values() if p.job_name == name]:
            del self.pods[pod.name]
        return True

    def trigger(self, function: str, *, requested_by: str, reason: str) -> str:
        if self.fail_triggers:
            raise ClusterError(f"creating a Job from jobfence-{function} failed: HTTP 403 "
                               "(injected)")
        name = f"jobfence-{function}-manual-{len(self.triggered)}"
        self.triggered.append({"function": function, "requested_by": requested_by,
                               "reason": reason, "job": name})
        return name

    def review_token(self, token: str) -> Identity | None:
        return self.tokens.get(token)
