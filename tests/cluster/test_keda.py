"""The pools on the real KEDA operator (built from its pinned sources, devtools/keda): the
base deployed as ``make deploy`` deploys it — each shipped pool's ScaledJob and the
TriggerAuthentication — and KEDA's operator, out of cluster, watching this module's
namespace only. KEDA runs each pool's trigger query with the scaler login from the Secret
and creates the Jobs; the Job controller makes their pods; the node agent runs them.

One namespace, one database and one operator for the whole module (the tests run in file
order, each leaving its queues empty). What differs from what ships:

* the pools' ``pollingInterval`` is 2 s (shipped: 10 s): the test's pool declaration is
  manifests/pools.yaml with that one value changed, rendered by the product's own
  renderer, and the difference checked to be only that;
* the installation's settings of ``tests/support/kube.py`` ``TEST_CONFIG`` (reconciliation
  graces), and its CronJobs suspended.

Nothing here waits on a clock it asserts: "KEDA started nothing" is judged after KEDA was
seen to run the queue's query twice more (its session in ``pg_stat_activity``), so that
its decision on the first of those polls is done.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg.rows import dict_row

from devtools.roles import login_name
from jobfence.pools import Pool, Pools, scaled_job, template
from jobfence.store.queues import scaler_query
from tests.support import REPO, run_cli
from tests.support.kube import (
    ControlPlane,
    Installation,
    delete_namespace,
    install,
    keda_operator,
    new_namespace,
    wait_for,
)
from tests.support.pg import Databases

POLLING = 2
"""The pools' pollingInterval in these tests (shipped: 10 s)."""
KEDA_LABEL = "scaledjob.keda.sh/name"
Obj = dict[str, Any]


def shipped() -> Pools:
    return Pools.model_validate(yaml.safe_load((REPO / "manifests" / "pools.yaml").read_text()))


def declaration() -> Pools:
    """The tests' pool declaration: the shipped one with ``pollingInterval`` shortened."""
    pools = shipped()
    return pools.model_copy(update={"pools": [p.model_copy(update={"polling_interval": POLLING})
                                              for p in pools.pools]})


def declaration_patches() -> tuple[Obj, ...]:
    """The test's declaration as patches of the base: rendered like the shipped one, and
    checked to differ from it in ``pollingInterval`` only."""
    base, ours, theirs = template(), declaration(), shipped()
    patches = []
    for mine, ship in zip(ours.pools, theirs.pools, strict=True):
        a = scaled_job(mine, scaler_query(ours.schema_name, mine.queue), base)
        b = scaled_job(ship, scaler_query(theirs.schema_name, ship.queue), base)
        differ = {k for k in a["spec"].keys() | b["spec"].keys()
                  if a["spec"].get(k) != b["spec"].get(k)}
        assert differ == {"pollingInterval"}, differ
        assert {k: v for k, v in a.items() if k != "spec"} == \
            {k: v for k, v in b.items() if k != "spec"}
        patches.append({"target": {"kind": "ScaledJob", "name": a["metadata"]["name"]},
                        "patch": json.dumps([{"op": "replace", "path": "/spec/pollingInterval",
                                              "value": a["spec"]["pollingInterval"]}])})
    return tuple(patches)


@dataclass
class Pooled:
    inst: Installation
    dsn: str
    log: Path

    @property
    def ns(self) -> str:
        return self.inst.namespace

    def cli(self, *args: str, input: str | None = None) -> str:
        out = run_cli(self.dsn, *args, input=input)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def enqueue(self, queue: str, n: int, seconds: float = 0.2) -> list[str]:
        spec = [{"actions": [{"name": "sleep", "params": {"seconds": seconds}}],
                 "queue": queue}] * n
        out = self.cli("enqueue", "--spec", "-", input=json.dumps(spec))
        return [json.loads(line)["job_id"] for line in out.splitlines() if line.strip()]

    def jobs(self, ids: list[str]) -> list[Obj]:
        return self.inst.sql("SELECT job_id::text, queue, status, attempt_count, attempt_id, "
                             "claimed_by AS worker_id, visible_at, claimed_at, finished_at "
                             "FROM jobs WHERE job_id = ANY(%s::uuid[]) ORDER BY claimed_at", ids)

    def wait_succeeded(self, ids: list[str], timeout: float = 300) -> list[Obj]:
        def done() -> list[Obj] | None:
            rows = self.jobs(ids)
            bad = [r for r in rows if r["status"] in ("failed", "cancelled")]
            assert not bad, (bad, self.log.read_text()[-3000:])
            return rows if all(r["status"] == "succeeded" for r in rows) else None

        return wait_for(done, what=f"{len(ids)} jobs succeeded", timeout=timeout, interval=0.5)

    def keda_jobs(self, pool: str | None = None) -> list[Obj]:
        selector = f"{KEDA_LABEL}=jobfence-worker-{pool}" if pool else KEDA_LABEL
        with self.inst.api() as api:
            items: list[Obj] = api.get(f"/apis/batch/v1/namespaces/{self.ns}/jobs",
                                       labelSelector=selector)["items"]
        return items

    def running_keda_jobs(self) -> list[str]:
        return [j["metadata"]["name"] for j in self.keda_jobs() if not finished(j)]

    def polled(self, queues: list[str], since: float, times: int = 2,
               timeout: float = 120) -> None:
        """Wait until KEDA ran each of ``queues``' trigger queries ``times`` more times
        after the wall-clock time ``since`` (its sessions' ``query_start``): its decision
        on the first of those polls is done (one goroutine polls and then scales)."""
        seen: dict[str, set[dt.datetime]] = {q: set() for q in queues}
        after = dt.datetime.fromtimestamp(since, dt.UTC)
        login = login_name("jobfence", "scaler")

        def enough() -> bool:
            with psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row) as conn:
                rows = conn.execute(
                    "SELECT query, query_start FROM pg_stat_activity WHERE usename = %s "
                    "AND datname = current_database() AND query_start > %s",
                    (login, after)).fetchall()
            for r in rows:
                for q in queues:
                    if f"queue = '{q}'" in r["query"]:
                        seen[q].add(r["query_start"])
            return all(len(s) >= times for s in seen.values())

        wait_for(enough, what=f"KEDA polled {queues} {times} times", timeout=timeout,
                 interval=0.1)


def finished(job: Obj) -> bool:
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def created(obj: Obj) -> dt.datetime:
    return dt.datetime.fromisoformat(obj["metadata"]["creationTimestamp"].replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def pooled(kube: ControlPlane, databases: Databases) -> Iterator[Pooled]:
    ns = new_namespace(kube, "keda-pools")
    url = databases.create()
    try:
        inst = install(kube, ns, url, patches=declaration_patches())
        with keda_operator(kube, ns) as log:
            yield Pooled(inst, url, log)
    finally:
        delete_namespace(kube, ns)
        databases.drop(url)


def test_each_shipped_pool_runs_its_jobs_once_and_returns_to_zero(pooled: Pooled) -> None:
    before = {j["metadata"]["name"] for j in pooled.keda_jobs()}
    ids = {"default": pooled.enqueue("default", 3), "datums": pooled.enqueue("datums", 6)}
    rows = pooled.wait_succeeded(ids["default"] + ids["datums"])
    # Each job claimed once (attempt 1) under a fence of its own, by a pod of its pool.
    assert [r["attempt_count"] for r in rows] == [1] * len(rows)
    assert len({r["attempt_id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["worker_id"].startswith(f"jobfence-worker-{r['queue']}-"), r
    made = {j["metadata"]["name"]: j for j in pooled.keda_jobs()
            if j["metadata"]["name"] not in before}
    assert {j["metadata"]["labels"][KEDA_LABEL] for j in made.values()} == \
        {"jobfence-worker-default", "jobfence-worker-datums"}
    # Back to zero: every Job KEDA made finishes, and later polls start no other.
    wait_for(lambda: not pooled.running_keda_jobs(), what="no running Job", timeout=180)
    settled = {j["metadata"]["name"] for j in pooled.keda_jobs()}
    pooled.polled(["default", "datums"], time.time())
    assert {j["metadata"]["name"] for j in pooled.keda_jobs()} <= settled
    assert not pooled.running_keda_jobs()
    failed = [n for n, j in made.items() if any(c["type"] == "Failed" and c["status"] == "True"
              for c in (j.get("status") or {}).get("conditions") or [])]
    assert not failed


def test_a_paused_queue_holds_its_work_until_resumed(pooled: Pooled) -> None:
    pooled.cli("queue", "pause", "datums")
    before = {j["metadata"]["name"] for j in pooled.keda_jobs("datums")}
    ids = pooled.enqueue("datums", 3)  # enqueues succeed while paused
    pooled.polled(["datums"], time.time())
    assert {j["metadata"]["name"] for j in pooled.keda_jobs("datums")} <= before
    assert {r["status"] for r in pooled.jobs(ids)} == {"pending"}
    pooled.cli("queue", "resume", "datums")
    pooled.wait_succeeded(ids)
    wait_for(lambda: not pooled.running_keda_jobs(), what="no running Job", timeout=180)


def test_drain_mode_starts_nothing_in_any_pool(pooled: Pooled) -> None:
    for q in ("default", "datums"):  # work in hand before drain refuses new enqueues
        pooled.cli("queue", "pause", q)
    ids = pooled.enqueue("default", 2) + pooled.enqueue("datums", 2)
    pooled.cli("drain", "on", "--reason", "test")
    for q in ("default", "datums"):
        pooled.cli("queue", "resume", q)
    before = {j["metadata"]["name"] for j in pooled.keda_jobs()}
    pooled.polled(["default", "datums"], time.time())
    assert {j["metadata"]["name"] for j in pooled.keda_jobs()} <= before
    assert {r["status"] for r in pooled.jobs(ids)} == {"pending"}
    pooled.cli("drain", "off")
    pooled.wait_succeeded(ids)
    wait_for(lambda: not pooled.running_keda_jobs(), what="no running Job", timeout=180)


def test_a_queue_limit_bounds_the_running_jobs_across_the_pools_pods(pooled: Pooled) -> None:
    limit = 2
    pooled.cli("queue", "limit", "datums", str(limit))
    try:
        ids = pooled.enqueue("datums", 8, 1.0)
        rows = pooled.wait_succeeded(ids)
    finally:
        pooled.cli("queue", "limit", "datums", "none")
    # The most jobs running at once, from each attempt's claim and finish (ends first).
    edges = sorted([(r["claimed_at"], 1) for r in rows] + [(r["finished_at"], -1) for r in rows],
                   key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    assert 1 <= most <= limit, rows
    wait_for(lambda: not pooled.running_keda_jobs(), what="no running Job", timeout=180)


def test_a_scheduled_job_starts_no_pod_before_its_run_at(pooled: Pooled) -> None:
    before = {j["metadata"]["name"] for j in pooled.keda_jobs("datums")}
    out = pooled.cli("enqueue", "--queue", "datums", "--delay", "PT6S",
                     'sleep:{"seconds": 0.2}')
    [job_id] = [json.loads(line)["job_id"] for line in out.splitlines() if line.strip()]
    [row] = pooled.jobs([job_id])
    run_at: dt.datetime = row["visible_at"]
    pooled.polled(["datums"], time.time(), times=1)
    [row] = pooled.wait_succeeded([job_id])
    assert row["claimed_at"] >= run_at
    made = [j for j in pooled.keda_jobs("datums") if j["metadata"]["name"] not in before]
    assert made
    # creationTimestamp has whole seconds: the Job and its pod come no earlier than the
    # second of run_at.
    floor = run_at.replace(microsecond=0)
    assert all(created(j) >= floor for j in made), (run_at, [created(j) for j in made])
    pods = [p for j in made for p in pooled.inst.pods_of_job(j["metadata"]["name"])]
    assert pods and all(created(p) >= floor for p in pods)
    wait_for(lambda: not pooled.running_keda_jobs(), what="no running Job", timeout=180)


def test_keda_reads_only_the_scaler_secret_and_that_login_runs_only_the_query(
        pooled: Pooled) -> None:
    with pooled.inst.api() as api:
        auth = api.get(f"/apis/keda.sh/v1alpha1/namespaces/{pooled.ns}/"
                       "triggerauthentications/jobfence-database")
        scaled = api.get(f"/apis/keda.sh/v1alpha1/namespaces/{pooled.ns}/scaledjobs")["items"]
        secret = api.get(f"/api/v1/namespaces/{pooled.ns}/secrets/jobfence-database-scaler")
    assert auth["spec"] == {"secretTargetRef": [
        {"parameter": "connection", "name": "jobfence-database-scaler", "key": "url"}]}
    for s in scaled:
        [trigger] = s["spec"]["triggers"]
        assert trigger["authenticationRef"] == {"name": "jobfence-database"}
        assert set(trigger["metadata"]) == {"query", "targetQueryValue",
                                            "activationTargetQueryValue"}
    # KEDA's sessions are the scaler login's, and nobody else runs the trigger queries.
    pooled.polled(["default", "datums"], time.time(), times=1)
    with psycopg.connect(pooled.dsn, autocommit=True, row_factory=dict_row) as conn:
        users = {r["usename"] for r in conn.execute(
            "SELECT usename FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE %s", ("%jobfence_control%queue = %",)).fetchall()}
    assert users == {login_name("jobfence", "scaler")}
    import base64

    url = base64.b64decode(secret["data"]["url"]).decode()
    refused = {
        "read a job's actions": "SELECT actions FROM jobfence.jobs LIMIT 1",
        "read a job's fence": "SELECT attempt_id FROM jobfence.jobs LIMIT 1",
        "read the audit trail": "SELECT count(*) FROM jobfence.job_events",
        "enqueue": "INSERT INTO jobfence.jobs (job_id, status, actions, max_attempts) "
                   "VALUES (gen_random_uuid(), 'pending', '[]', 3)",
        "claim": "SELECT job_id FROM jobfence.worker_claim('default', 'w', 30, 1)",
        "switch drain mode": "UPDATE jobfence.jobfence_control SET draining = true",
        "identity": "SELECT * FROM jobfence.jobfence_identity()",
    }
    with psycopg.connect(url, autocommit=True) as conn:
        for q in ("default", "datums"):
            row = conn.execute(scaler_query("jobfence", q).replace("%", "%%")).fetchone()
            assert row is not None and row[0] == 0
        for what, statement in refused.items():
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
            assert what


def test_a_pool_on_an_image_the_node_cannot_map_is_refused_with_a_pod_event(
        pooled: Pooled) -> None:
    image = "registry.example/team/tools:1.0"
    pool = Pool(name="team", image=image, maxPods=1, pollingInterval=POLLING)
    obj = scaled_job(pool, scaler_query("jobfence", pool.queue), template())
    labels = obj["spec"]["jobTargetRef"]["template"]["metadata"]["labels"]
    labels["jobfence.io/installation"] = pooled.inst.installation
    out = pooled.inst.cluster.run("-n", pooled.ns, "apply", "--server-side", "-f", "-",
                                  input=json.dumps(obj))
    assert out.returncode == 0, out.stderr
    [job_id] = pooled.enqueue("team", 1)
    try:
        def refused() -> Obj | None:
            for pod in pooled.inst.pods("jobfence.io/pool=team"):
                with pooled.inst.api() as api:
                    events = api.get(f"/api/v1/namespaces/{pooled.ns}/events",
                                     fieldSelector=f"involvedObject.name="
                                                   f"{pod['metadata']['name']}")["items"]
                for e in events:
                    if e["reason"] == "Failed" and image in e["message"]:
                        return {"pod": pod, "event": e}
            return None

        seen = wait_for(refused, what="the pod's event", timeout=120, interval=0.5)
        assert seen["event"]["type"] == "Warning"
        assert seen["event"]["message"].startswith(f'Failed to pull image "{image}"')
        with pooled.inst.api() as api:
            pod = api.get(f"/api/v1/namespaces/{pooled.ns}/pods/"
                          f"{seen['pod']['metadata']['name']}")
        assert pod["status"]["phase"] == "Pending"
        assert {r["status"] for r in pooled.jobs([job_id])} == {"pending"}
    finally:
        pooled.cli("cancel", job_id)
        pooled.inst.cluster.run("-n", pooled.ns, "delete", "scaledjob", "jobfence-worker-team",
                                "--wait=false")
