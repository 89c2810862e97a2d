"""Installations apart, on the real API: two installations in one namespace (the second
deployed with a nameSuffix and its own database), and a third in another namespace with
the same identity as the first (two teams both deploying the base as it is). Each has more
worker pods than a page (``limit``/``continue`` followed to the end), a claim whose pod is
gone, claims whose pods run, and pods nothing claims. Each one's reconciliation and
orphan-cleanup, run in its own pods under its own ServiceAccounts, reclaims and deletes
only its own; the others' pods, Jobs and claims are untouched. Every delete carries the uid
the listing saw as a precondition (read back from the API server's audit log)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest

from tests.support.kube import (
    WORKER_LABELS,
    ControlPlane,
    Installation,
    claim_as,
    delete_namespace,
    install,
    new_namespace,
    remote_pod,
    suspended_job,
)
from tests.support.pg import Databases

PAGE = 3
LIVE, IDLE = 2, 5  # 7 pods: three pages


@dataclass
class World:
    inst: Installation
    prefix: str
    gone: str = ""
    live: list[str] = field(default_factory=list)
    jobs: dict[str, str] = field(default_factory=dict)
    """Every Job of its pods: name → uid."""

    def seed(self, kube: ControlPlane) -> None:
        labels = {**WORKER_LABELS, "jobfence.io/installation": self.inst.installation}
        with kube.admin() as api:
            for kind, count in (("live", LIVE), ("idle", IDLE)):
                for i in range(count):
                    name = f"{self.prefix}-{kind}-{i}"
                    job = suspended_job(api, self.inst.namespace, name)
                    self.jobs[name] = job["metadata"]["uid"]
                    remote_pod(api, self.inst.namespace, name, labels=labels, owner=job)
        self.live = [claim_as(self.inst.dsn, f"{self.prefix}-live-{i}") for i in range(LIVE)]
        self.gone = claim_as(self.inst.dsn, f"{self.prefix}-gone-0")

    def statuses(self) -> dict[str, str]:
        return {str(r["job_id"]): r["status"] for r in self.inst.sql(
            "SELECT job_id, status FROM jobs")}

    def jobs_left(self, kube: ControlPlane) -> set[str]:
        with kube.admin() as api:
            items = api.get(f"/apis/batch/v1/namespaces/{self.inst.namespace}/jobs")["items"]
        return {j["metadata"]["name"] for j in items if j["metadata"]["name"] in self.jobs}

    def pods_deleting(self, kube: ControlPlane) -> set[str]:
        with kube.admin() as api:
            items = api.get(f"/api/v1/namespaces/{self.inst.namespace}/pods")["items"]
        return {p["metadata"]["name"] for p in items if p["metadata"]["name"] in self.jobs
                and p["metadata"].get("deletionTimestamp")}

    def run_passes(self) -> dict[str, dict[str, int]]:
        out = {}
        for function in ("reconciliation", "orphan-cleanup"):
            job = self.inst.run_from_cronjob(function, f"{self.prefix}-{function}")
            self.inst.wait_job(job)
            out[function] = self.inst.summary(job)
        return out


@pytest.fixture
def other_namespace(kube: ControlPlane) -> Iterator[str]:
    name = new_namespace(kube, "apart-other")
    yield name
    delete_namespace(kube, name)


def test_each_installation_reconciles_and_cleans_only_its_own(
        kube: ControlPlane, namespace: str, other_namespace: str, dsn: str,
        databases: Databases) -> None:
    config = {"JOBFENCE_KUBE_PAGE_SIZE": str(PAGE)}
    dsn_b, dsn_c = databases.create(), databases.create()
    try:
        # Every test database is a copy of one template, and so of its identity: B takes
        # its own; C keeps A's (the same identity in another namespace).
        with psycopg.connect(dsn_b, autocommit=True) as conn:
            conn.execute("UPDATE jobfence.jobfence_control SET installation = 'jf-other'")
        a = World(install(kube, namespace, dsn, config=config), "a")
        b = World(install(kube, namespace, dsn_b, config=config, name_suffix="-b"), "b")
        c = World(install(kube, other_namespace, dsn_c, config=config), "a")
        assert a.inst.installation == c.inst.installation != b.inst.installation
        worlds = [a, b, c]
        for w in worlds:
            w.seed(kube)
        before = {id(w): w.statuses() for w in worlds}

        for w in worlds:
            report = w.run_passes()
            rec, clean = report["reconciliation"], report["orphan-cleanup"]
            assert (rec["pods_listed"], rec["pages"]) == (LIVE + IDLE, 3), rec
            assert (rec["missing_pods_detected"], rec["retried"]) == (1, 1), rec
            assert clean["orphaned_pods_cleaned"] == IDLE, clean
            # Its own: the gone claim reclaimed, the live ones kept, the idle Jobs deleted.
            now = w.statuses()
            assert now[w.gone] == "pending"
            assert all(now[j] == "running" for j in w.live)
            assert w.jobs_left(kube) == {f"{w.prefix}-live-{i}" for i in range(LIVE)}
            # The others': untouched, whatever their turn.
            for other in worlds:
                if other is w:
                    continue
                done = worlds.index(other) < worlds.index(w)
                expected_jobs = ({f"{other.prefix}-live-{i}" for i in range(LIVE)} if done
                                 else set(other.jobs))
                assert other.jobs_left(kube) == expected_jobs
                if not done:
                    assert other.statuses() == before[id(other)]
                    assert other.pods_deleting(kube) == set()

        # Every delete by an orphan-cleanup named the uid of what its listing saw.
        deletes = [e for e in kube.audit() if e["verb"] == "delete"
                   and e["user"]["username"].endswith(("jobfence-orphan-cleanup",
                                                       "jobfence-orphan-cleanup-b"))
                   and e["objectRef"]["namespace"] in (namespace, other_namespace)]
        assert len(deletes) == 3 * IDLE
        for e in deletes:
            ns, name = e["objectRef"]["namespace"], e["objectRef"]["name"]
            assert e["objectRef"]["resource"] == "jobs"
            [owner] = [w for w in worlds if w.inst.namespace == ns and name in w.jobs
                       and e["user"]["username"].endswith(
                           f"jobfence-orphan-cleanup{w.inst.suffix}")]
            assert e["requestObject"]["preconditions"]["uid"] == owner.jobs[name]
            assert e["responseStatus"]["code"] == 200
    finally:
        databases.drop(dsn_b)
        databases.drop(dsn_c)
