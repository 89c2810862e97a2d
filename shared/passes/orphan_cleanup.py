"""orphan-cleanup: delete what nothing in the database owns.

* **Worker pods holding no live claim** — an anomaly (a worker runs one job and exits): a
  running worker pod seen unclaimed by passes spanning the grace period is logged at error
  level and deleted with its Job (deleting only the pod would make Kubernetes start
  another). Its claim is re-checked right before the delete.
* **Finished worker pods beyond the history limit** — deleted with their Jobs, newest kept.
* **S3 objects under the installation's prefix ``jobfence/INSTALLATION/``** that belong to
  a fenced-out, failed or cancelled attempt, or to a job that no longer exists, once older
  than the grace period. Nothing outside that prefix is ever listed. A live
  claim's outputs, a winning attempt's committed outputs, those of an earlier attempt
  that finished an action of its job's current run (a resumed run skipped that action:
  its files are the job's) and a parent's manifest are never touched.

Objects first, then pods. Everything is paged (1,000 keys, one page of pods at a time) and
decided in the database; a failed delete is logged and counted and the pass goes on. A pod
listing that cannot be completed changes nothing and fails the pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from uuid import UUID

from jobfence.cluster import Cluster
from jobfence.errors import ClusterError
from jobfence.logs import get_logger
from jobfence.objectstore import ObjectInfo, ObjectStore, ObjectStoreError, installation_prefix
from jobfence.passes.harness import Deps, snapshot
from jobfence.settings import Settings
from jobfence.store import Store
from jobfence.store.types import PodRef, Suspect

log = get_logger("jobfence.orphan_cleanup")

KEYS_PER_PAGE = 1000
MAX_OBJECT_PAGES = 1000
PODS_PER_PAGE = 500
ORPHAN_POD_GRACE_SECONDS = 30
"""Grace period of the delete itself: the worker's SIGTERM clean-up takes about 2 s."""


@dataclass(slots=True, kw_only=True)
class Report:
    """Counts of one pass, filled as it goes."""

    function: str
    cluster: str
    pods_listed: int = snapshot()
    orphan_suspects: int = snapshot()
    """Running worker pods seen without a live claim this pass (not yet past the grace)."""
    orphaned_pods_detected: int = 0
    orphaned_pods_cleaned: int = 0
    orphaned_pods_cleanup_failures: int = 0
    finished_pods_deleted: int = 0
    finished_pods_cleanup_failures: int = 0
    objects_scanned: int = snapshot()
    orphaned_objects_detected: int = 0
    orphaned_objects_deleted: int = 0
    orphaned_objects_cleanup_failures: int = 0
    objects_unrecognized: int = snapshot()


# -- objects ---------------------------------------------------------------------------


def owner_of(key: str, prefix: str) -> tuple[UUID, UUID | None] | None:
    """``PREFIX/JOB/ATTEMPT/…`` → (job, attempt); ``PREFIX/JOB/file`` → (job, None);
    anything else None (not ours to judge). ``prefix`` is the installation's own."""
    parts = key[len(prefix):].split("/") if key.startswith(prefix) else []
    if len(parts) < 2 or not parts[-1]:
        return None
    try:
        job = UUID(parts[0])
    except ValueError:
        return None
    if len(parts) == 2:
        return job, None
    try:
        return job, UUID(parts[1])
    except ValueError:
        return job, None


def _pages(objects: Iterator[ObjectInfo]) -> Iterator[list[ObjectInfo]]:
    while page := list(islice(objects, KEYS_PER_PAGE)):
        yield page


def clean_objects(store: Store, objects: ObjectStore, bucket: str, installation: str, *,
                  cutoff: datetime, c: Report,
                  checkpoint: Callable[[], None] = lambda: None) -> None:
    """Only the installation's own prefix is listed and judged: another installation's
    objects in a shared bucket, or anything else there, are never this pass's business.
    ``checkpoint`` runs before each page (a stopped pass stops there)."""
    prefix = installation_prefix(installation)
    for n, page in enumerate(_pages(objects.iter_objects(bucket, prefix))):
        if n >= MAX_OBJECT_PAGES:
            log.info("object_scan_capped", pages=n, message="the next pass goes on")
            break
        checkpoint()
        c.objects_scanned += len(page)
        owned = [(obj, owner_of(obj.key, prefix)) for obj in page]
        c.objects_unrecognized += sum(1 for _, o in owned if o is None)
        verdicts = store.pods.object_owners(sorted({o for _, o in owned if o is not None},
                                              key=str))
        doomed = [obj.key for obj, o in owned
                  if o is not None and verdicts.get(o) in ("garbage", "gone")
                  and obj.last_modified < cutoff]
        c.orphaned_objects_detected += len(doomed)
        if not doomed:
            continue
        failures = objects.delete_many(bucket, doomed)
        for f in failures[:5]:
            log.error("orphaned_object_cleanup_failed", key=f.key, error=f.error)
        c.orphaned_objects_cleanup_failures += len(failures)
        c.orphaned_objects_deleted += len(doomed) - len(failures)
        log.info("orphaned_objects_deleted", count=len(doomed) - len(failures),
                 first=doomed[0])


# -- pods ------------------------------------------------------------------------------


def _delete(cluster: Cluster, pod: PodRef | Suspect, grace: int) -> bool:
    """Delete a worker pod through its Job when it has one; True if something went. Each
    delete names the uid the listing saw: a pod or Job that took the name since is never
    touched."""
    if pod.job_name and cluster.delete_job(pod.job_name, uid=pod.job_uid, grace_seconds=grace):
        return True
    return cluster.delete_pod(pod.name, uid=pod.uid, grace_seconds=grace)


def clean_pods(settings: Settings, deps: Deps, cluster: Cluster, c: Report) -> None:
    with deps.pod_snapshot(cluster) as listed:  # ClusterError: nothing changed yet
        c.pods_listed += listed.pods
        _clean_listed(settings, deps, cluster, c, listed.listed_at)


def _clean_listed(settings: Settings, deps: Deps, cluster: Cluster, c: Report,
                  listed_at: datetime) -> None:
    store = deps.store
    confirm_before = listed_at - timedelta(seconds=settings.orphan_pod_grace_seconds)
    after = ""
    while rows := store.pods.unclaimed_pods(listed_at=listed_at,
                                            grace_seconds=settings.reconcile_grace_seconds,
                                            after=after, limit=PODS_PER_PAGE):
        after = rows[-1].name
        deps.checkpoint()
        for suspect in store.pods.note_suspects(pods=rows, listed_at=listed_at):
            if suspect.first_seen > confirm_before:
                c.orphan_suspects += 1
                continue
            name = suspect.name
            if not store.pods.confirm_suspect(name):
                continue  # it claimed work since the listing: not an orphan
            c.orphaned_pods_detected += 1
            log.error("orphaned_pod_detected", pod=name, job_name=suspect.job_name,
                      first_seen=suspect.first_seen.isoformat(), severity="BUG_INDICATOR",
                      message="a worker pod held no live claim for the whole grace period")
            try:
                _delete(cluster, suspect, ORPHAN_POD_GRACE_SECONDS)
            except ClusterError as exc:
                c.orphaned_pods_cleanup_failures += 1
                log.error("orphaned_pod_cleanup_failed", pod=name, error=str(exc))
                continue
            c.orphaned_pods_cleaned += 1
            log.info("orphaned_pod_deleted", pod=name)
    store.pods.forget_suspects(listed_at=listed_at)
    after = ""
    while rows := store.pods.finished_pods_beyond_history(
            keep=settings.finished_pod_history, after=after, limit=PODS_PER_PAGE):
        after = rows[-1].name
        deps.checkpoint()
        for pod in rows:
            try:
                if _delete(cluster, pod, 0):
                    c.finished_pods_deleted += 1
            except ClusterError as exc:
                c.finished_pods_cleanup_failures += 1
                log.error("finished_pod_cleanup_failed", pod=pod.name, error=str(exc))


def run_once(settings: Settings, deps: Deps) -> Report:
    c = Report(function="orphan-cleanup", cluster=settings.cluster)
    if settings.s3_bucket:
        now = deps.store.pods.now(deps.now)
        cutoff = now - timedelta(seconds=settings.orphan_object_grace_seconds)
        try:
            clean_objects(deps.store, deps.objects, settings.s3_bucket, deps.installation,
                          cutoff=cutoff, c=c, checkpoint=deps.checkpoint)
        except ObjectStoreError as exc:  # the listing itself failed: the next pass retries
            log.error("object_scan_failed", error=str(exc))
            c.orphaned_objects_cleanup_failures += 1
    cluster = deps.cluster
    if cluster is not None:
        clean_pods(settings, deps, cluster, c)
    return c
