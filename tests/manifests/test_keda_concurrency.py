"""The trigger of a pool whose pods run many jobs at once, as KEDA's default scaling
strategy reads it: one pod per ``concurrency`` jobs of ready work and live claims, never a
pod more than the work needs, none while draining."""

from __future__ import annotations

import math

import pytest

from jobfence.store import Store
from tests.support.factories import enqueue_one
from tests.support.keda import Trigger, claim, trigger_of, value
from tests.support.manifests import Obj, pools

CONCURRENT = [p for p in pools().pools if p.concurrency > 1]


@pytest.fixture(scope="module", params=[p.name for p in CONCURRENT])
def pool(base: list[Obj], request: pytest.FixtureRequest) -> tuple[Trigger, int]:
    [declared] = [p for p in CONCURRENT if p.name == request.param]
    trigger = trigger_of(base, request.param)
    assert trigger.target == declared.concurrency
    return trigger, declared.concurrency


def test_a_shipped_pool_runs_many_jobs_per_pod() -> None:
    assert CONCURRENT, "the draining pool as shipped runs many jobs per pod"


def test_ready_work_starts_one_pod_per_concurrency(store: Store,
                                                   pool: tuple[Trigger, int]) -> None:
    trigger, c = pool
    for _ in range(c * 2 + 1):
        enqueue_one(store, queue=trigger.queue)
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=0) == 3


def test_full_pods_start_pods_for_the_ready_work_only(store: Store,
                                                      pool: tuple[Trigger, int]) -> None:
    trigger, c = pool
    for _ in range(c * 2 + c // 2):
        enqueue_one(store, queue=trigger.queue)
    claim(store, c * 2, trigger.queue)  # two pods, every slot taken
    ready = c // 2
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=2) == math.ceil(ready / c)


def test_pods_with_free_slots_take_the_ready_work_themselves(
        store: Store, pool: tuple[Trigger, int]) -> None:
    trigger, c = pool
    for _ in range(c):
        enqueue_one(store, queue=trigger.queue)
    claim(store, c // 2, trigger.queue)  # one pod, half its slots taken, half ready
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=1) == 0


def test_nothing_ready_starts_no_pod_and_draining_none(store: Store,
                                                       pool: tuple[Trigger, int]) -> None:
    trigger, c = pool
    for _ in range(c * 3):
        enqueue_one(store, queue=trigger.queue)
    claim(store, c * 3, trigger.queue)
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=3) == 0
    enqueue_one(store, queue=trigger.queue)
    store.control.set_drain(on=True, reason="upgrade")
    assert trigger.new_jobs(value(store.conn, trigger), running_jobs=3) == 0
