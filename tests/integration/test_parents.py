"""Parents and children, dependencies, and finalization on the real store: exactly one
finalization however many finishers race, committed outputs only from winning attempts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from uuid import UUID

import pytest

from devtools.memory_objects import MemoryObjectStore
from devtools.roles import ensure_logins
from devtools.sqlconn import connect
from jobfence.finalize import finalize, finalize_parent
from jobfence.objectstore import manifest_key
from jobfence.store import IMMEDIATE, Claim, Store
from tests.support import run_cli
from tests.support.factories import enqueue_one, installation, make_parent, new_job

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

BUCKET = "out"


_claims: dict[UUID, Claim] = {}


def run_child(store: Store, child: UUID, ok: bool = True, outputs: int = 1) -> UUID:
    """Claim (the whole ready queue, remembering the claims) and complete one child."""
    for c in store.attempts.claim(worker_id="w", lease_seconds=30, limit=1000):
        _claims[c.job_id] = c
    claim = _claims.pop(child)
    urls = [(f"o{i}", f"s3://{BUCKET}/jobfence/{child}/{claim.attempt_id}/o{i}")
            for i in range(outputs)]
    assert store.attempts.register_outputs(job_id=child, attempt_id=claim.attempt_id, outputs=urls)
    assert store.attempts.confirm_outputs(job_id=child, attempt_id=claim.attempt_id, outputs=[
        {"path": p, "status": "done", "size_bytes": 1, "error": None} for p, _ in urls])
    if ok:
        assert store.attempts.finish(job_id=child, attempt_id=claim.attempt_id, succeeded=True)
    else:
        assert store.attempts.release(job_id=child, attempt_id=claim.attempt_id, reason="boom",
                             retry=IMMEDIATE, error="boom")
    return claim.attempt_id


def test_parent_starts_running_and_is_never_claimed(store: Store) -> None:
    parent, kids = make_parent(store, 3)
    row = store.jobs.get(parent)
    assert row is not None and row.status == "running" and row.is_parent
    claimed = {c.job_id for c in store.attempts.claim(worker_id="w", lease_seconds=30, limit=10)}
    assert claimed == set(kids)
    assert store.jobs.children_counts(parent) == {"running": 3}


def test_last_child_finalizes_with_manifest_of_committed_outputs(store: Store) -> None:
    objects = MemoryObjectStore()
    parent, kids = make_parent(store, 2)
    winners = [run_child(store, k) for k in kids]
    assert finalize_parent(store, lambda: objects, BUCKET, installation(store), parent) is not None
    row = store.jobs.get(parent)
    assert row is not None and row.status == "succeeded"
    assert row.manifest == f"s3://{BUCKET}/{manifest_key(installation(store), parent)}"
    manifest = json.loads(objects.get_bytes(BUCKET, manifest_key(installation(store), parent)))
    assert manifest["children"] == {"total": 2, "succeeded": 2}
    for item, kid, attempt in zip(manifest["items"], kids, winners, strict=True):
        assert item["job_id"] == str(kid) and item["attempt_id"] == str(attempt)
        assert item["outputs"] == [f"s3://{BUCKET}/jobfence/{kid}/{attempt}/o0"]


def test_outputs_of_a_fenced_out_attempt_are_never_committed(store: Store) -> None:
    objects = MemoryObjectStore()
    parent, [kid] = make_parent(store, 1)
    [first] = store.attempts.claim(worker_id="w1", lease_seconds=30)
    assert store.attempts.register_outputs(job_id=kid, attempt_id=first.attempt_id,
                                  outputs=[("o0", "s3://out/first/o0")])
    store.conn.execute("UPDATE jobs SET visible_at = now() - interval '1 s' "
                       "WHERE job_id = %s", (kid,))
    assert store.maintenance.reclaim_expired(retry=IMMEDIATE, batch_size=10)
    # The stale attempt can neither register nor confirm anything any more.
    assert not store.attempts.register_outputs(job_id=kid, attempt_id=first.attempt_id,
                                      outputs=[("o1", "s3://out/first/o1")])
    assert not store.attempts.confirm_outputs(job_id=kid, attempt_id=first.attempt_id, outputs=[
        {"path": "o0", "status": "done", "size_bytes": 1, "error": None}])
    second = run_child(store, kid)
    finalize_parent(store, lambda: objects, BUCKET, installation(store), parent)
    manifest = json.loads(objects.get_bytes(BUCKET, manifest_key(installation(store), parent)))
    assert manifest["items"][0]["outputs"] == [f"s3://{BUCKET}/jobfence/{kid}/{second}/o0"]


def test_a_failed_child_fails_the_parent_with_counts_and_first_errors(
        store: Store) -> None:
    objects = MemoryObjectStore()
    parent, kids = make_parent(store, 3, max_attempts=1)
    run_child(store, kids[0])
    run_child(store, kids[1], ok=False)
    one_left = finalize_parent(store, lambda: objects, BUCKET, installation(store), parent)
    assert one_left is None
    run_child(store, kids[2])
    t = finalize_parent(store, lambda: objects, BUCKET, installation(store), parent)
    assert t is not None and t.status == "failed"
    row = store.jobs.get(parent)
    assert row is not None
    assert row.error.startswith(f"1 of 3 children did not succeed ({kids[1]}: failed: boom")
    manifest = json.loads(objects.get_bytes(BUCKET, manifest_key(installation(store), parent)))
    assert [i["outputs"] != [] for i in manifest["items"]] == [True, False, True]


def test_racing_finalizers_finalize_exactly_once(dsn: str, store: Store) -> None:
    objects = MemoryObjectStore()
    parent, kids = make_parent(store, 5)
    for k in kids:
        run_child(store, k)
    conns = [connect(dsn) for _ in range(12)]
    barrier = threading.Barrier(len(conns))

    mine = installation(store)

    def finalize(i: int):  # type: ignore[no-untyped-def]
        barrier.wait()
        return finalize_parent(Store(conns[i]), lambda: objects, BUCKET, mine, parent)

    try:
        with ThreadPoolExecutor(len(conns)) as pool:
            results = list(pool.map(finalize, range(len(conns))))
    finally:
        for c in conns:
            c.close()
    assert sum(1 for r in results if r is not None) == 1
    terminal = [e for e in store.jobs.events(parent) if e.to_status == "succeeded"]
    assert len(terminal) == 1


def test_cancelling_a_parent_cancels_unfinished_children(store: Store) -> None:
    parent, kids = make_parent(store, 3)
    run_child(store, kids[0])
    running = _claims[kids[1]]
    done = store.jobs.cancel(job_id=parent, reason="stop it")
    assert {t.job_id for t in done} == {parent, *kids[1:]}
    assert store.jobs.children_counts(parent) == {"succeeded": 1, "cancelled": 2}
    assert store.attempts.heartbeat(job_id=running.job_id, attempt_id=running.attempt_id,
                           lease_seconds=30) is None


def test_a_parent_cancelled_after_its_last_child_keeps_its_children(store: Store) -> None:
    """Between its last child's success and its finalization a parent is still running; an
    operator's cancel then ends it and leaves every child as it finished, and finalization
    never touches it again (the chaos run's parent check allows exactly this)."""
    parent, kids = make_parent(store, 2)
    for k in kids:
        run_child(store, k)
    done = store.jobs.cancel(job_id=parent, reason="stop it")
    assert [t.job_id for t in done] == [parent]
    assert store.jobs.children_counts(parent) == {"succeeded": 2}
    objects = MemoryObjectStore()
    assert finalize_parent(store, lambda: objects, BUCKET, installation(store), parent) is None
    row = store.jobs.get(parent)
    assert row is not None and row.status == "cancelled"


@pytest.fixture
def as_worker(dsn: str) -> Iterator[Store]:
    """The store as the worker role's login sees it: its functions and nothing else."""
    urls = ensure_logins(dsn)
    with connect(urls["worker"]) as conn:
        yield Store(conn)


def test_the_attempt_that_ends_the_last_child_finalizes_the_parent_as_the_worker(
        store: Store, as_worker: Store) -> None:
    """Seconds, not a pass: the worker whose attempt ended the last child finalizes the
    parent, with the manifest, through the functions that answer that attempt only — and
    only once no child is active."""
    parent, kids = make_parent(store, 2)
    claims = {c.job_id: c for c in as_worker.attempts.claim(worker_id="w", lease_seconds=30,
                                                           limit=10)}
    objects = MemoryObjectStore()
    first, last = claims[kids[0]], claims[kids[1]]
    assert as_worker.attempts.finish(job_id=first.job_id, attempt_id=first.attempt_id,
                                     succeeded=True)
    early = as_worker.parents.of_attempt(first.job_id, first.attempt_id)
    # A sibling still runs: nothing answers, not its live fence, not the parent.
    assert early.summary() is None
    assert early.children_page(after=UUID(int=0), limit=10) == []
    assert finalize(early, lambda: objects, BUCKET, installation(store)) is None
    assert as_worker.attempts.finish(job_id=last.job_id, attempt_id=last.attempt_id,
                                     succeeded=True)
    # Another attempt (the sibling's live one earlier, or any) is told nothing.
    assert as_worker.parents.of_attempt(last.job_id, first.attempt_id).summary() is None
    done = finalize(as_worker.parents.of_attempt(last.job_id, last.attempt_id),
                    lambda: objects, BUCKET, installation(store))
    assert done is not None and done.status == "succeeded"
    row = store.jobs.get(parent)
    assert row is not None and row.status == "succeeded" and row.manifest
    body = json.loads(objects.get_bytes(BUCKET, manifest_key(installation(store), parent)))
    assert [i["job_id"] for i in body["items"]] == [str(k) for k in kids]
    # Once only: the earlier child's attempt, export-finalize, a repeat — all too late.
    assert finalize(as_worker.parents.of_attempt(first.job_id, first.attempt_id),
                    lambda: objects, BUCKET, installation(store)) is None
    assert finalize_parent(store, lambda: objects, BUCKET, installation(store), parent) is None
    # The children's kept attempt ids the manifest lists are no fence: no write takes them.
    assert as_worker.attempts.heartbeat(job_id=first.job_id, attempt_id=first.attempt_id,
                                        lease_seconds=30) is None
    assert not as_worker.attempts.finish(job_id=first.job_id, attempt_id=first.attempt_id,
                                         succeeded=False)


def test_a_worker_finishes_the_last_datum_and_the_parent_at_once(
        dsn: str, store: Store) -> None:
    """`jobfence worker`, as the worker role's login: when it has run the last datum the
    parent is finished too — `jobfence wait PARENT` returns then, not at export-finalize's
    next pass."""
    parent, _ = make_parent(store, 3)
    r = run_cli(dsn, "worker", "--max-jobs", "3")
    assert r.returncode == 0, r.stderr
    row = store.jobs.get(parent)
    assert row is not None and row.status == "succeeded", r.stderr
    assert row.reason == "3/3 children succeeded"


def test_dependency_chain_fails_transitively_with_the_reason(store: Store) -> None:
    a = enqueue_one(store, max_attempts=1)
    [b] = store.jobs.enqueue([new_job(after=(a,))])
    [c] = store.jobs.enqueue([new_job(after=(b.job_id,))])
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    store.attempts.release(job_id=a, attempt_id=claim.attempt_id, reason="boom", retry=IMMEDIATE,
                  error="boom")
    rb, rc = store.jobs.get(b.job_id), store.jobs.get(c.job_id)
    assert rb is not None and rc is not None
    assert (rb.status, rb.error) == ("failed", f"dependency {a} failed")
    assert (rc.status, rc.error) == ("failed", f"dependency {b.job_id} failed")


def test_dependency_on_a_cancelled_or_missing_job_fails(store: Store) -> None:
    a = enqueue_one(store)
    [b] = store.jobs.enqueue([new_job(after=(a,))])
    store.jobs.cancel(job_id=a)
    rb = store.jobs.get(b.job_id)
    assert rb is not None and rb.error == f"dependency {a} cancelled"
    gone = enqueue_one(store)
    [d] = store.jobs.enqueue([new_job(after=(gone,))])
    store.conn.execute("DELETE FROM jobs WHERE job_id = %s", (gone,))  # retention, say
    assert store.dependencies.resolve([d.job_id])[0].status == "failed"
    rd = store.jobs.get(d.job_id)
    assert rd is not None and rd.error == f"dependency {gone} missing"


def test_parent_after_a_dependency_waits_then_releases_its_children(
        store: Store) -> None:
    a = enqueue_one(store)
    parent, _ = make_parent(store, 2, after=(a,))
    assert store.jobs.children_counts(parent) == {"waiting": 2}
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    assert claim.job_id == a
    store.attempts.finish(job_id=a, attempt_id=claim.attempt_id, succeeded=True)
    row = store.jobs.get(parent)
    assert row is not None and row.status == "running"
    assert store.jobs.children_counts(parent) == {"pending": 2}


def test_waiting_page_and_resolve_are_the_safety_net(store: Store) -> None:
    a = enqueue_one(store)
    [b] = store.jobs.enqueue([new_job(after=(a,))])
    # The dependency finished without settling its dependents (a crash right after commit).
    [claim] = store.attempts.claim(worker_id="w", lease_seconds=30)
    store.conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() "
                       "WHERE job_id = %s", (a,))
    assert store.dependencies.waiting_page(after=UUID(int=0), limit=10) == [b.job_id]
    [t] = store.dependencies.resolve([b.job_id])
    assert t.status == "pending"
    _ = claim
