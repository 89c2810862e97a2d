"""Action metrics (migration 0029, ``jobfence.store.action_metrics``): every stored action
outcome — recorded alone, with a terminal write, in a batch of them, or with a give-back —
counts one run by queue, action and outcome and one run time; a result's ``usage`` is
observed in the CPU and memory histograms' right buckets, and no usage observes nothing; a
write whose fence was lost observes nothing; names no worker registered count as ``other``
(the series stay bounded whatever a job names), and a name no worker registered for 30 days
is forgotten with its totals; the exposition shows it all; a real worker registers its
registry (built-ins and installed plugins)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobfence import metrics
from jobfence.store import IMMEDIATE, ActionOutcome, Store, TerminalWrite
from jobfence.store.action_metrics import OTHER
from tests.support import REPO, run_cli
from tests.support.factories import enqueue_one
from tests.support.procs import FAST

pytestmark = pytest.mark.pooled

MiB = 2**20
PLUGIN = {"PYTHONPATH": str(REPO / "tests" / "fixtures" / "plugin")}


def action(index: int, name: str, ok: bool = True, result: Any = None,
           took: float = 0.2) -> ActionOutcome:
    return ActionOutcome(index, name, ok, datetime.now(UTC) - timedelta(seconds=took),
                         result=result, error=None if ok else "exit 1")


def claimed(store: Store, queue: str, names: list[str], lease: float = 300) -> Any:
    enqueue_one(store, queue=queue, actions=[{"name": n, "params": {}} for n in names])
    [c] = store.attempts.claim(worker_id="w", lease_seconds=lease, queue=queue)
    return c


def runs(store: Store) -> Counter[tuple[str, str, str]]:
    store.action_metrics.fold()
    return Counter({(t.queue, t.action, t.label): int(t.value)
                    for t in store.action_metrics.totals() if t.name == "runs"})


def histogram(store: Store, name: str) -> dict[tuple[str, str], dict[float, float]]:
    """The folded buckets of one histogram, per (queue, action), and its sum under -1."""
    store.action_metrics.fold()
    out: dict[tuple[str, str], dict[float, float]] = {}
    for t in store.action_metrics.totals():
        if t.name == name:
            out.setdefault((t.queue, t.action), {})[t.le] = t.value
        elif t.name == name + "_sum":
            out.setdefault((t.queue, t.action), {})[-1.0] = t.value
    return out


def test_actions_of_two_names_in_two_queues_are_separate_series(store: Store) -> None:
    # queue a: a sleep recorded alone, then a command with the terminal write.
    c = claimed(store, "a", ["sleep", "command"])
    assert store.attempts.record_action(job_id=c.job_id, attempt_id=c.attempt_id,
                                        outcome=action(0, "sleep"))
    assert store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True,
                                 outcome=action(1, "command"))
    # queue b: a command fails (given back), then succeeds in a batch of terminal writes.
    c = claimed(store, "b", ["command"])
    assert store.attempts.release(job_id=c.job_id, attempt_id=c.attempt_id, reason="exit 1",
                                  retry=IMMEDIATE, outcome=action(0, "command", ok=False))
    [c] = store.attempts.claim(worker_id="w", lease_seconds=300, queue="b")
    d = claimed(store, "b", ["sleep"])
    written, _ = store.attempts.finish_many([
        TerminalWrite(c.job_id, c.attempt_id, True, action(0, "command")),
        TerminalWrite(d.job_id, d.attempt_id, True, action(0, "sleep", took=20))])
    assert written == {c.job_id, d.job_id}
    assert runs(store) == Counter({
        ("a", "sleep", "succeeded"): 1, ("a", "command", "succeeded"): 1,
        ("b", "command", "failed"): 1, ("b", "command", "succeeded"): 1,
        ("b", "sleep", "succeeded"): 1})
    ran = histogram(store, "run")
    assert set(ran) == {("a", "sleep"), ("a", "command"), ("b", "command"), ("b", "sleep")}
    assert ran[("b", "command")][0.5] == 2  # 0.2 s each, in the (0.1, 0.5] bucket
    assert ran[("b", "sleep")][30.0] == 1 and 19 < ran[("b", "sleep")][-1] < 25
    assert store.action_metrics.fold() == 0  # folded exactly once
    assert sum(runs(store).values()) == 5


def test_a_results_usage_is_observed_in_its_buckets(store: Store) -> None:
    c = claimed(store, "a", ["command", "command"])
    assert store.attempts.record_action(job_id=c.job_id, attempt_id=c.attempt_id, outcome=action(
        0, "command", result={"exit_code": 0,
                              "usage": {"cpu_seconds": 0.3, "peak_memory_bytes": 3 * MiB}}))
    # A failed command reports its usage too.
    assert store.attempts.release(
        job_id=c.job_id, attempt_id=c.attempt_id, reason="exit 1", retry=IMMEDIATE,
        outcome=action(1, "command", ok=False, result={
            "usage": {"cpu_seconds": 4000, "peak_memory_bytes": 64 * 2**30}}))
    cpu, memory = histogram(store, "cpu"), histogram(store, "memory")
    assert cpu == {("a", "command"): {0.5: 1, float("inf"): 1, -1.0: pytest.approx(4000.3)}}
    assert memory == {("a", "command"): {4.0 * MiB: 1, 64.0 * 2**30: 1,
                                         -1.0: 3 * MiB + 64 * 2**30}}
    bounds = store.action_metrics.buckets()
    assert bounds["cpu"][0] == 0.01 and bounds["cpu"][-2] == 3600
    assert bounds["memory"][0] == MiB and bounds["memory"][-2] == 64 * 2**30


@pytest.mark.parametrize("result", [
    None, {}, {"exit_code": 0}, {"usage": None}, {"usage": "lots"}, {"usage": [1, 2]},
    {"usage": {"cpu_seconds": "1.5", "peak_memory_bytes": True}}, {"usage": {}},
], ids=repr)
def test_a_result_without_usage_observes_no_usage(store: Store, result: Any) -> None:
    c = claimed(store, "a", ["command"])
    assert store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True,
                                 outcome=action(0, "command", result=result))
    assert histogram(store, "cpu") == {} and histogram(store, "memory") == {}
    assert runs(store) == Counter({("a", "command", "succeeded"): 1})


def test_one_usage_number_without_the_other_and_numbers_past_any_bucket(store: Store) -> None:
    c = claimed(store, "a", ["command"])
    assert store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True,
                                 outcome=action(0, "command", result={
                                     "usage": {"cpu_seconds": -2, "peak_memory_bytes": 10**400}}))
    assert histogram(store, "cpu") == {("a", "command"): {0.01: 1, -1.0: 0}}
    assert histogram(store, "memory") == {("a", "command"): {float("inf"): 1, -1.0: 1e18}}


def test_a_stale_attempts_writes_observe_nothing(store: Store, conn: Any) -> None:
    c = claimed(store, "a", ["command", "command"], lease=1)
    later = datetime.now(UTC) + timedelta(seconds=5)
    [t] = store.maintenance.reclaim_expired(retry=IMMEDIATE, batch_size=10, now=later)
    assert t.job_id == c.job_id
    usage = {"usage": {"cpu_seconds": 1, "peak_memory_bytes": MiB}}
    assert not store.attempts.record_action(job_id=c.job_id, attempt_id=c.attempt_id,
                                            outcome=action(0, "command", result=usage))
    assert store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True,
                                 outcome=action(1, "command", result=usage)) is None
    assert store.attempts.release(job_id=c.job_id, attempt_id=c.attempt_id, reason="x",
                                  retry=IMMEDIATE, outcome=action(1, "command")) is None
    assert store.attempts.finish_many(
        [TerminalWrite(c.job_id, c.attempt_id, True, action(1, "command", result=usage))]
    ) == (set(), [])
    assert conn.execute("SELECT count(*) AS n FROM action_metric_deltas").fetchone() == {"n": 0}
    assert store.action_metrics.fold() == 0 and store.action_metrics.totals() == []


def test_the_same_action_written_again_is_one_run(store: Store) -> None:
    """A write retried after its outcome was lost with the connection updates its row."""
    c = claimed(store, "a", ["sleep", "sleep"])
    for _ in range(2):
        assert store.attempts.record_action(job_id=c.job_id, attempt_id=c.attempt_id,
                                            outcome=action(0, "sleep"))
    assert runs(store) == Counter({("a", "sleep", "succeeded"): 1})


def test_names_no_worker_registered_count_as_other(store: Store, conn: Any) -> None:
    """A job enqueued around the registry (straight into the table, as a hostile enqueuer
    would) names whatever it likes: every such name is one series, ``other``."""
    for i in range(20):
        c = claimed(store, "a", [f"made-up-{i}"])
        store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=False,
                              outcome=action(0, f"made-up-{i}", ok=False))
    assert runs(store) == Counter({("a", OTHER, "failed"): 20})
    # Once a worker registers a name, it is a label of its own.
    assert store.action_metrics.register(["command", "sleep", "made-up-1"]) == 1
    assert store.action_metrics.register(["made-up-1"]) == 0
    c = claimed(store, "a", ["made-up-1"])
    store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True,
                          outcome=action(0, "made-up-1"))
    assert runs(store)[("a", "made-up-1", "succeeded")] == 1


def test_the_names_kept_are_bounded(store: Store, conn: Any) -> None:
    from jobfence.errors import JobfenceError

    with pytest.raises(JobfenceError, match="at most 1000"):
        store.action_metrics.register([f"n{i}" for i in range(1001)])
    store.action_metrics.register([f"n{i}" for i in range(1000)])
    store.action_metrics.register(["x" * 201, "", "late"])
    names = {r["name"] for r in conn.execute("SELECT name FROM action_names").fetchall()}
    assert len(names) == 1000 and "late" not in names and "command" in names
    # A name already known is still dated again (no new row).
    conn.execute("UPDATE action_names SET registered_at = now() - interval '2 hours' "
                 "WHERE name = 'command'")
    assert store.action_metrics.register(["command"]) == 0
    row = conn.execute("SELECT now() - registered_at < interval '1 minute' AS fresh "
                       "FROM action_names WHERE name = 'command'").fetchone()
    assert row == {"fresh": True}


def test_a_name_no_worker_registered_for_30_days_is_forgotten_with_its_totals(
        store: Store, conn: Any) -> None:
    store.action_metrics.register(["gone", "kept"])
    for name in ("gone", "kept"):
        c = claimed(store, "a", [name])
        store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True,
                              outcome=action(0, name))
    assert set(runs(store)) == {("a", "gone", "succeeded"), ("a", "kept", "succeeded")}
    conn.execute("UPDATE action_names SET registered_at = now() - interval '31 days' "
                 "WHERE name = 'gone'")
    store.action_metrics.fold()
    assert set(runs(store)) == {("a", "kept", "succeeded")}
    c = claimed(store, "a", ["gone"])
    store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True,
                          outcome=action(0, "gone"))
    assert runs(store)[("a", OTHER, "succeeded")] == 1


def test_the_exposition_shows_runs_and_histograms_by_queue_and_action(store: Store) -> None:
    c = claimed(store, "a", ["command"])
    store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True,
                          outcome=action(0, "command", result={
                              "usage": {"cpu_seconds": 0.3, "peak_memory_bytes": 3 * MiB}}))
    store.action_metrics.fold()
    text = metrics.exposition(store)
    assert ('jobfence_action_runs_total{action="command",outcome="succeeded",queue="a"} 1.0'
            in text)
    assert 'jobfence_action_run_seconds_bucket{action="command",le="0.5",queue="a"} 1.0' in text
    assert 'jobfence_action_run_seconds_count{action="command",queue="a"} 1.0' in text
    assert 'jobfence_action_cpu_seconds_bucket{action="command",le="0.1",queue="a"} 0.0' in text
    assert 'jobfence_action_cpu_seconds_bucket{action="command",le="0.5",queue="a"} 1.0' in text
    assert ('jobfence_action_peak_memory_bytes_bucket{action="command",le="4.194304e+06",'
            'queue="a"} 1.0' in text)
    assert 'jobfence_action_cpu_seconds_sum{action="command",queue="a"} 0.3' in text


def test_a_worker_registers_its_registry_plugins_included(dsn: Any, conn: Any) -> None:
    """The worker that has the plugin installed labels its action by name; a worker that
    does not have it fails the job, and the name it never registered is ``other``."""
    r = run_cli(dsn, "enqueue", 'shout:{"text": "a"}', "--max-attempts", "1", "--queue", "p",
                **PLUGIN)
    assert r.returncode == 0, r.stderr
    assert run_cli(dsn, "worker", "--queue", "p", **FAST).returncode == 1  # unknown here
    assert run_cli(dsn, "enqueue", 'shout:{"text": "b"}', "--queue", "p",
                   **PLUGIN).returncode == 0
    assert run_cli(dsn, "enqueue", 'sleep:{"seconds": 0}', "--queue", "s").returncode == 0
    r = run_cli(dsn, "worker", "--queue", "p", **FAST, **PLUGIN)
    assert r.returncode == 0, r.stderr
    assert run_cli(dsn, "worker", "--queue", "s", **FAST).returncode == 0
    store = Store(conn)
    assert runs(store) == Counter({("p", OTHER, "failed"): 1, ("p", "shout", "succeeded"): 1,
                                   ("s", "sleep", "succeeded"): 1})
    known = {r["name"] for r in conn.execute("SELECT name FROM action_names").fetchall()}
    assert {"shout", "spin", "command", "sleep"} <= known
