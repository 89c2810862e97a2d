"""Workflows on a real PostgreSQL: a dozen steps with a fan-out of hundreds of datums run
to the end in dependency order; a failing step fails what waits on it (naming the step)
and the workflow says where it failed; retry runs only the failed and the never-run steps
again (a fan-out step's failed datums with it); cancel stops every unfinished step; a key
makes a submission idempotent under a race; every graph a spec can hold is accepted exactly
when it is one (hypothesis), and a refused one writes nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from devtools.memory_objects import MemoryObjectStore
from devtools.roles import ensure_logins
from devtools.sqlconn import connect
from jobfence import workflows
from jobfence.errors import Conflict, InvalidSpec
from jobfence.finalize import finalize_parent
from jobfence.ids import uuid7
from jobfence.settings import Settings, load_settings
from jobfence.store import NewJob, Store
from tests.support.factories import installation

pytestmark = pytest.mark.pooled  # directly and through PgBouncer

NOOP = {"actions": [{"name": "sleep", "params": {"seconds": 0}}]}


def etl(datums: str = "s3://in/rows/") -> dict[str, Any]:
    """Twelve steps: extract, a fan-out transform over the datums, per-region loads, and a
    report after them all."""
    steps: dict[str, Any] = {
        "extract": NOOP,
        "validate": {**NOOP, "after": ["extract"]},
        "transform": {**NOOP, "inputs": datums, "after": ["validate"]},
    }
    regions = ["eu", "us", "apac", "latam", "mea", "anz", "nordics", "ch"]
    for r in regions:
        steps[f"load-{r}"] = {**NOOP, "after": ["transform"]}
    steps["report"] = {**NOOP, "after": [f"load-{r}" for r in regions]}
    return {"workflow": "nightly-etl", "steps": steps}


def objects_with(rows: int) -> MemoryObjectStore:
    objects = MemoryObjectStore()
    for i in range(rows):
        objects.put_bytes("in", f"rows/{i:04d}.csv", b"1")
    return objects


def config(dsn: str) -> Settings:
    return load_settings(database_url=dsn, s3_bucket="out")


def run_all(store: Store, objects: MemoryObjectStore,
            fails: Callable[[UUID], bool] = lambda _: False) -> list[UUID]:
    """Claim and finish every ready job (a failure where ``fails`` says), finalizing each
    parent once its datums are done, until nothing is ready; the jobs in the order run."""
    ran: list[UUID] = []
    while claims := store.attempts.claim(worker_id="w", lease_seconds=60, limit=1000):
        for c in claims:
            ran.append(c.job_id)
            if fails(c.job_id):
                store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id,
                                      succeeded=False, error="boom")
            else:
                store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id,
                                      succeeded=True)
            if c.parent_id is not None:
                finalize_parent(store, lambda: objects, "out", installation(store),
                                c.parent_id)
    return ran


TRACE = "0af7651916cd43dd8448eb211c80319c"


def submit(dsn: str, store: Store, spec: dict[str, Any], objects: MemoryObjectStore,
           ) -> workflows.Submitted:
    return workflows.submit_workflow(config(dsn), store, workflows.parse_workflow(spec),
                                     actor="test", objects=lambda: objects,
                                     traceparent=f"00-{TRACE}-b7ad6b7169203331-01")


def test_a_dozen_steps_and_three_hundred_datums_run_to_the_end_in_order(
        dsn: str, store: Store) -> None:
    objects = objects_with(300)
    done = submit(dsn, store, etl(), objects)
    assert len(done.steps) == 12 and done.created
    assert done.steps["extract"].status == "pending"
    assert {s.status for name, s in done.steps.items() if name != "extract"} == {"waiting"}
    ran = run_all(store, objects)
    order = {job: i for i, job in enumerate(ran)}
    ids = {name: s.job_id for name, s in done.steps.items()}
    assert order[ids["extract"]] < order[ids["validate"]]
    row, steps = workflows.get(store, done.workflow_id)
    assert (row.status, row.steps_done, row.failed_step) == ("succeeded", 12, None)
    assert row.finished_at is not None
    transform = store.jobs.get(ids["transform"])
    assert transform is not None and transform.is_parent
    assert store.jobs.children_counts(ids["transform"]) == {"succeeded": 300}
    assert len(ran) == 11 + 300  # each step once (the fan-out's parent is never claimed)
    datums = [j for j in ran if j not in ids.values()]
    last_datum = max(order[j] for j in datums)
    assert all(order[ids[f"load-{r}"]] > last_datum for r in ("eu", "us", "ch"))
    assert order[ids["report"]] == len(ran) - 1
    view = workflows.workflow_view(row, steps)
    assert list(view["steps"])[:3] == ["extract", "validate", "transform"]
    assert view["steps"]["report"]["after"] == sorted(f"load-{r}" for r in (
        "eu", "us", "apac", "latam", "mea", "anz", "nordics", "ch"))
    assert view["steps"]["transform"]["fan_out"] is True
    traces = {r["traceparent"][3:35] for r in store.conn.execute(
        "SELECT traceparent FROM jobfence.jobs WHERE workflow_id = %s OR parent_id = %s",
        (done.workflow_id, ids["transform"]))}
    assert traces == {TRACE}  # one trace spans the workflow, its datums too


def test_a_failed_step_stops_what_waits_on_it_and_retry_runs_only_those(
        dsn: str, store: Store) -> None:
    """load-eu fails: report never runs (failed, naming the step), the other loads succeed;
    retry runs load-eu and report again and nothing else."""
    objects = objects_with(20)
    done = submit(dsn, store, etl(), objects)
    ids = {name: s.job_id for name, s in done.steps.items()}
    run_all(store, objects, fails=lambda j: j == ids["load-eu"])
    row, steps = workflows.get(store, done.workflow_id)
    assert (row.status, row.failed_step) == ("failed", "load-eu")
    by = {s.step: s for s in steps}
    assert by["report"].status == "failed" and by["report"].attempt_count == 0
    assert "(step load-eu) failed" in str(by["report"].error)
    assert by["load-us"].status == "succeeded"
    again = workflows.retry(store, done.workflow_id, actor="ops", reason="fixed the loader")
    assert again == {"load-eu": "pending", "report": "waiting"}
    ran = run_all(store, objects)
    assert sorted(ran, key=str) == sorted([ids["load-eu"], ids["report"]], key=str)
    assert ran.index(ids["load-eu"]) < ran.index(ids["report"])
    row, steps = workflows.get(store, done.workflow_id)
    assert row.status == "succeeded"
    assert {s.step: s.attempt_count for s in steps}["extract"] == 1  # kept, not run again
    events = [r["action"] for r in store.conn.execute(
        "SELECT action FROM jobfence.control_events WHERE subject = %s ORDER BY event_id",
        (str(done.workflow_id),))]
    assert events == ["workflow_submit", "workflow_retry"]


def test_retry_runs_a_fan_out_steps_failed_datums_and_keeps_the_others(
        dsn: str, store: Store) -> None:
    objects = objects_with(30)
    done = submit(dsn, store, etl(), objects)
    transform = done.steps["transform"].job_id
    kids = [c.job_id for c in store.parents.children_page(parent_id=transform,
                                                          after=UUID(int=0), limit=100)]
    bad = set(kids[:3])
    run_all(store, objects, fails=lambda j: j in bad)
    row, _ = workflows.get(store, done.workflow_id)
    assert (row.status, row.failed_step) == ("failed", "transform")
    assert store.jobs.children_counts(transform) == {"succeeded": 27, "failed": 3}
    again = workflows.retry(store, done.workflow_id, actor="ops", reason="bad rows fixed")
    assert again["transform"] == "running" and len(again) == 1 + 8 + 1
    ran = run_all(store, objects)
    assert bad <= set(ran) and not set(kids[3:]) & set(ran)  # only the failed datums
    row, _ = workflows.get(store, done.workflow_id)
    assert row.status == "succeeded"
    assert store.jobs.children_counts(transform) == {"succeeded": 30}


def wrote(store: Store, c: Any, *names: str) -> None:
    """The attempt ``c`` uploaded ``names`` (registered and confirmed under its fence)."""
    assert store.attempts.register_outputs(job_id=c.job_id, attempt_id=c.attempt_id, outputs=[
        (n, f"s3://out/{c.job_id}/{c.attempt_id}/{n}") for n in names])
    assert store.attempts.confirm_outputs(job_id=c.job_id, attempt_id=c.attempt_id, outputs=[
        {"path": n, "status": "done", "size_bytes": 1, "error": None} for n in names])


def test_a_step_takes_the_outputs_of_the_steps_before_it(dsn: str, store: Store) -> None:
    """load takes extract's files and the transform datums' (a name two datums wrote comes
    under each datum's id), committed outputs only; report takes load's. A retry of the
    workflow hands load the files of the run that won, not of the one before."""
    objects = objects_with(3)
    spec = {"workflow": "handoff", "steps": {
        "extract": {**NOOP, "max_attempts": 1},
        "transform": {**NOOP, "inputs": "s3://in/rows/", "after": ["extract"]},
        "load": {**NOOP, "inputs": {"steps": ["extract", "transform"]}},
        "report": {**NOOP, "inputs": {"steps": ["load"]}}}}
    done = submit(dsn, store, spec, objects)
    ids = {name: s.job_id for name, s in done.steps.items()}
    assert done.steps["load"].status == "waiting"  # its inputs' steps are in its after
    store.conn.execute(  # an attempt that never committed: its file is never handed
        "INSERT INTO jobfence.job_outputs (job_id, attempt_id, path, url, status) "
        "VALUES (%s, gen_random_uuid(), 'stale.csv', 's3://out/stale.csv', 'done')",
        (ids["extract"],))
    seen: dict[UUID, Any] = {}

    def run(first: str, fails: frozenset[UUID] = frozenset()) -> None:
        while claims := store.attempts.claim(worker_id="w", lease_seconds=60, limit=1000):
            for c in claims:
                seen[c.job_id] = c.inputs
                wrote(store, c, *({ids["extract"]: [first, "b.csv"], ids["load"]: ["rows.db"]}
                                  .get(c.job_id, ["part.out"])))
                store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id,
                                      succeeded=c.job_id not in fails, error="boom")
                if c.parent_id is not None:
                    finalize_parent(store, lambda: objects, "out", installation(store),
                                    c.parent_id)

    run("a.csv", fails=frozenset({ids["extract"]}))  # extract fails (once: max_attempts 1)
    row, steps = workflows.get(store, done.workflow_id)
    assert (row.status, row.failed_step) == ("failed", "extract")
    workflows.retry(store, done.workflow_id, actor="ops", reason="fixed")
    run("c.csv")
    row, steps = workflows.get(store, done.workflow_id)
    assert row.status == "succeeded", steps
    datums = sorted(str(c.job_id) for c in store.parents.children_page(
        parent_id=ids["transform"], after=UUID(int=0), limit=10))
    names = [f["name"] for f in seen[ids["load"]]["files"]]
    assert names == ["extract/b.csv", "extract/c.csv"] + [
        f"transform/{d}/part.out" for d in datums]
    assert all(f["url"].startswith("s3://out/") for f in seen[ids["load"]]["files"])
    assert [f["name"] for f in seen[ids["report"]]["files"]] == ["load/rows.db"]
    view = workflows.workflow_view(row, steps)["steps"]
    assert view["load"]["inputs_from"] == ["extract", "transform"]
    assert view["load"]["inputs_handed"] == 5 and view["extract"]["inputs_handed"] is None
    got = store.conn.execute(
        "SELECT inputs, failure FROM jobfence.jobfence_step_inputs(%s, %s, 4)",
        (done.workflow_id, Jsonb({"steps": {"extract": str(ids["extract"]),
                                            "transform": str(ids["transform"])}}))
    ).fetchone()  # one more file than it may take: refused, naming the count
    assert got is not None and got["inputs"] is None
    assert "left 5 files, more than the 4" in got["failure"]


def test_a_job_written_by_hand_takes_no_files_of_another_workflows_step(
        dsn: str, store: Store) -> None:
    """An operator's login writes a job row itself, its inputs naming a step of someone
    else's workflow (and waiting on it): when it is settled it fails, naming that job, and
    nothing of the step's files is handed to it."""
    objects = objects_with(0)
    other = submit(dsn, store, {"workflow": "theirs", "steps": {"secret": NOOP}}, objects)
    [c] = store.attempts.claim(worker_id="w", lease_seconds=60)
    wrote(store, c, "payroll.csv")
    store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True)
    forged = uuid7()
    with connect(ensure_logins(dsn.direct)["operator"]) as conn:
        mine = Store(conn)
        with mine.jobs.enqueuing() as adding:
            adding.add([NewJob(job_id=forged, actions=NOOP["actions"], max_attempts=1,
                               after=(c.job_id,),
                               inputs={"steps": {"secret": str(c.job_id)}})])
        mine.dependencies.resolve([forged])
        job = mine.jobs.get(forged)
    assert job is not None and job.status == "failed"
    assert f"inputs name job {c.job_id}, which is not a step of its workflow" in str(job.error)
    assert "files" not in job.inputs
    assert other.steps["secret"].job_id == c.job_id


def test_a_step_fans_out_over_the_files_of_the_steps_before_it(dsn: str,
                                                                store: Store) -> None:
    """transform fans out over extract's five files, two a datum: its three datums are made
    when it starts, each with its files; load takes their outputs. With no files to fan out
    over, the step fails saying so, and a retry once there are some runs it."""
    objects = objects_with(0)
    spec = {"workflow": "fan", "steps": {
        "extract": {**NOOP, "max_attempts": 1},
        "transform": {**NOOP, "inputs": {"steps": ["extract"], "per_datum": 2}},
        "load": {**NOOP, "inputs": {"steps": ["transform"]}}}}
    done = submit(dsn, store, spec, objects)
    ids = {name: s.job_id for name, s in done.steps.items()}
    assert done.steps["transform"].status == "waiting"
    seen: dict[UUID, Any] = {}
    parts: list[str] = []

    def run() -> None:
        while claims := store.attempts.claim(worker_id="w", lease_seconds=60, limit=1000):
            for c in claims:
                seen[c.job_id] = c.inputs
                if c.job_id == ids["extract"] and parts:
                    wrote(store, c, *parts)
                elif c.parent_id == ids["transform"]:
                    wrote(store, c, *(f["name"].split("/")[1] + ".out"
                                      for f in c.inputs["files"]))
                store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id,
                                      succeeded=True)
                if c.parent_id is not None:
                    finalize_parent(store, lambda: objects, "out", installation(store),
                                    c.parent_id)

    run()  # extract wrote nothing
    row, steps = workflows.get(store, done.workflow_id)
    assert (row.status, row.failed_step) == ("failed", "transform")
    assert "no files to fan out over" in str({s.step: s for s in steps}["transform"].error)
    assert store.jobs.children_counts(ids["transform"]) == {}
    parts[:] = [f"p{i}.csv" for i in range(5)]
    workflows.retry(store, done.workflow_id, actor="ops", reason="the day landed")
    store.conn.execute("UPDATE jobfence.jobs SET status = 'failed' WHERE job_id = %s",
                       (ids["extract"],))  # run extract again too: it writes this time
    workflows.retry(store, done.workflow_id, actor="ops", reason="extract again")
    run()
    row, steps = workflows.get(store, done.workflow_id)
    assert row.status == "succeeded", steps
    datums = store.parents.children_page(parent_id=ids["transform"], after=UUID(int=0),
                                         limit=10)
    given = sorted([f["name"] for f in seen[d.job_id]["files"]] for d in datums)
    assert given == [["extract/p0.csv", "extract/p1.csv"], ["extract/p2.csv", "extract/p3.csv"],
                     ["extract/p4.csv"]]
    assert all(d.job_id.version == 7 for d in datums)
    assert [f["name"] for f in seen[ids["load"]]["files"]] == [
        f"transform/p{i}.csv.out" for i in range(5)]
    view = workflows.workflow_view(row, steps)["steps"]
    assert view["transform"]["fan_out"] and view["transform"]["inputs_handed"] == 5


def test_a_step_whose_files_would_share_a_name_fails_naming_it(dsn: str,
                                                                 store: Store) -> None:
    """A datum's job code writes a file under another datum's id, where that datum's own
    file (its name shared) is put: the step after them fails, naming the file, and nothing
    is handed to it."""
    objects = objects_with(2)
    spec = {"workflow": "clash", "steps": {
        "transform": {**NOOP, "inputs": "s3://in/rows/"},
        "load": {**NOOP, "inputs": {"steps": ["transform"]}}}}
    done = submit(dsn, store, spec, objects)
    first, second = store.attempts.claim(worker_id="w", lease_seconds=60, limit=2)
    wrote(store, first, "part.out")
    wrote(store, second, "part.out", f"{first.job_id}/part.out")
    for c in (first, second):
        store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id, succeeded=True)
    finalize_parent(store, lambda: objects, "out", installation(store),
                    done.steps["transform"].job_id)
    load = store.jobs.get(done.steps["load"].job_id)
    assert load is not None and load.status == "failed"
    assert f"both be transform/{first.job_id}/part.out" in str(load.error)
    assert "files" not in load.inputs


def test_cancel_stops_every_unfinished_step(dsn: str, store: Store) -> None:
    objects = objects_with(10)
    done = submit(dsn, store, etl(), objects)
    running = store.attempts.claim(worker_id="w", lease_seconds=60)  # extract
    assert [c.job_id for c in running] == [done.steps["extract"].job_id]
    cancelled = workflows.cancel(store, done.workflow_id, actor="ops", reason="wrong day")
    assert cancelled == 12
    row, steps = workflows.get(store, done.workflow_id)
    assert row.status == "cancelled" and row.failed_step is None
    assert {s.status for s in steps} == {"cancelled"}
    extract = store.jobs.get(done.steps["extract"].job_id)
    assert extract is not None and extract.stopping_until is not None  # told to stop
    # The running attempt's late write is fenced out.
    assert store.attempts.finish(job_id=running[0].job_id, attempt_id=running[0].attempt_id,
                                 succeeded=True) is None
    assert store.attempts.claim(worker_id="w", lease_seconds=60, limit=100) == []


def test_a_key_makes_a_submission_idempotent_under_a_race(dsn: str, store: Store) -> None:
    """Eight submitters of one keyed workflow at once: one workflow, one set of steps, every
    submitter answered with it; the key with another spec is a conflict."""
    objects = objects_with(5)
    spec = {**etl(), "idempotency_key": "etl-2026-11-29"}
    barrier = threading.Barrier(8)

    def one(_: int) -> workflows.Submitted:
        with connect(dsn) as conn:
            s = Store(conn)
            barrier.wait()
            return submit(dsn, s, spec, objects)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    assert len({a.workflow_id for a in answers}) == 1
    assert sum(a.created for a in answers) == 1
    assert len({a.steps["report"].job_id for a in answers}) == 1
    count = store.conn.execute("SELECT count(*) AS n FROM jobfence.jobs WHERE workflow_id "
                               "IS NOT NULL").fetchone()
    assert count["n"] == 12
    other = {**spec, "steps": {**spec["steps"], "extract": {**NOOP, "priority": 5}}}
    with pytest.raises(Conflict, match="idempotency_key"):
        submit(dsn, store, other, objects)


# -- what a workflow spec may be ------------------------------------------------------------

def test_refused_specs_name_the_problem() -> None:
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "a cycle": ({"a": {**NOOP, "after": ["c"]}, "b": {**NOOP, "after": ["a"]},
                     "c": {**NOOP, "after": ["b"]}}, "form a cycle"),
        "an unknown step": ({"a": {**NOOP, "after": ["nope"]}}, "neither a step"),
        "after itself": ({"a": {**NOOP, "after": ["a"]}}, "after itself"),
        "a bad name": ({"Bad Name": NOOP}, "not a step name"),
        "a step's own key": ({"a": {**NOOP, "idempotency_key": "k"}}, "no idempotency_key"),
        "a bad job spec": ({"a": {"actions": []}}, "step a"),
        "no steps": ({}, "at least one"),
        "too many": ({f"s{i}": NOOP for i in range(workflows.MAX_STEPS + 1)}, "at most 1000"),
        "inputs from an unknown step": ({"a": {**NOOP, "inputs": {"steps": ["nope"]}}},
                                        "inputs from 'nope', which is not a step"),
        "inputs from itself": ({"a": {**NOOP, "inputs": {"steps": ["a"]}}}, "from itself"),
        "inputs from a step twice": ({"a": NOOP, "b": {**NOOP, "inputs": {
            "steps": ["a", "a"]}}}, "named twice in its inputs"),
        "inputs from steps and a url": ({"a": NOOP, "b": {**NOOP, "inputs": {
            "steps": ["a"], "url": "s3://in/x/"}}}, "steps and per_datum only"),
        "no datums": ({"a": NOOP, "b": {**NOOP, "inputs": {
            "steps": ["a"], "per_datum": 0}}}, "per_datum must be a whole number"),
        "a datum of yes": ({"a": NOOP, "b": {**NOOP, "inputs": {
            "steps": ["a"], "per_datum": True}}}, "per_datum must be a whole number"),
        "no steps to take from": ({"a": {**NOOP, "inputs": {"steps": []}}}, "list of step"),
        "a cycle through inputs": ({"a": {**NOOP, "inputs": {"steps": ["b"]}},
                                    "b": {**NOOP, "after": ["a"]}}, "form a cycle"),
    }
    for what, (steps, said) in cases.items():
        with pytest.raises(InvalidSpec, match=said):
            workflows.parse_workflow({"workflow": "w", "steps": steps})
        assert what


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                         max_size=3 * n))))
def test_any_graph_is_accepted_exactly_when_it_has_no_cycle(graph: tuple[int, list[
        tuple[int, int]]]) -> None:
    """A generated graph of steps (an edge a -> b: b is after a): parsed when it is acyclic,
    with an order that puts every step after those it waits on; refused when it is not,
    saying why (a step after itself, or a cycle)."""
    import graphlib

    n, edges = graph
    after: dict[str, set[str]] = {f"s{i}": set() for i in range(n)}
    for a, b in edges:
        after[f"s{b}"].add(f"s{a}")
    spec = {"workflow": "g", "steps": {  # every other step names its steps by its inputs
        s: {**NOOP, "after": sorted(d)} if i % 2 or not d else
        {**NOOP, "inputs": {"steps": sorted(d)}} for i, (s, d) in enumerate(after.items())}}
    try:
        list(graphlib.TopologicalSorter(after).static_order())
        acyclic = all(s not in d for s, d in after.items())
    except graphlib.CycleError:
        acyclic = False
    if not acyclic:
        with pytest.raises(InvalidSpec, match=r"cycle|after itself|from itself"):
            workflows.parse_workflow(spec)
        return
    w = workflows.parse_workflow(spec)
    position = {s: i for i, s in enumerate(w.order)}
    assert sorted(w.order) == sorted(after)
    assert all(position[d] < position[s] for s, deps in after.items() for d in deps)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=12))
def test_whatever_a_workflow_spec_holds_it_is_refused_cleanly_or_accepted(
        store: Store, junk: object) -> None:
    """A workflow whose steps (or one step) are any JSON at all: parsed, or refused with
    InvalidSpec — never another error — and a refusal writes nothing."""
    for data in ({"workflow": "w", "steps": junk}, {"workflow": "w", "steps": {"a": junk}},
                 {"workflow": junk, "steps": {"a": NOOP}}):
        try:
            workflows.parse_workflow(data)
        except InvalidSpec:
            pass
    assert store.workflows.page(limit=1) == []


ANY_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                        | st.text(max_size=8), lambda kids: st.lists(kids, max_size=3)
                        | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                        max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    ANY_JSON,
    st.lists(st.sampled_from(["a", "b", "c", "zz"]) | ANY_JSON, max_size=4),
), st.one_of(st.none(), ANY_JSON, st.integers(-5, 10_005)),
   st.dictionaries(st.sampled_from(["url", "x", "per_datum"]), ANY_JSON, max_size=2))
def test_whatever_a_steps_inputs_hold_they_are_refused_cleanly_or_kept_exactly(
        named: object, per_datum: object, more: dict[str, object]) -> None:
    """A step's ``inputs: {steps, per_datum, ...}`` of any shape: refused with InvalidSpec
    (never another error), or accepted only when it names other steps of the workflow,
    each once, with a whole per_datum from 1 to 10,000 or none — and then kept exactly,
    its steps in its after."""
    inputs = {"steps": named, **more}
    if per_datum is not None:
        inputs["per_datum"] = per_datum
    spec = {"workflow": "w", "steps": {"a": NOOP, "b": NOOP, "c": {**NOOP, "inputs": inputs}}}
    try:
        w = workflows.parse_workflow(spec)
    except InvalidSpec:
        return
    given = inputs.get("per_datum")
    assert isinstance(named, list) and named and len(set(named)) == len(named)
    assert set(named) <= {"a", "b"} and set(inputs) <= {"steps", "per_datum"}
    assert given is None or (type(given) is int and 1 <= given <= 10_000)
    assert w.inputs_from["c"] == workflows.Taken(tuple(named), given)
    assert set(named) <= set(w.after["c"])


def test_lifecycle_deletes_a_workflow_once_retention_took_its_steps(
        dsn: str, store: Store) -> None:
    """A workflow older than the audit retention stays while any of its steps does; once
    retention has deleted them all, the lifecycle pass deletes it too."""
    from datetime import timedelta

    objects = objects_with(0)
    spec = {"workflow": "w", "steps": {"a": NOOP, "b": {**NOOP, "after": ["a"]}}}
    done = submit(dsn, store, spec, objects)
    store.conn.execute("UPDATE jobfence.workflows SET created_at = now() - interval '400 "
                       "days' WHERE workflow_id = %s", (done.workflow_id,))
    m = store.maintenance
    assert m.delete_old_workflows(older_than=timedelta(days=90), limit=10) == 0
    store.conn.execute("DELETE FROM jobfence.jobs WHERE workflow_id = %s",
                       (done.workflow_id,))
    assert m.delete_old_workflows(older_than=timedelta(days=90), limit=10) == 1
    assert store.workflows.get(done.workflow_id) is None


def test_the_metrics_count_workflows_and_each_names_latest(dsn: str, store: Store) -> None:
    from jobfence.metrics import StoreCollector

    objects = objects_with(3)
    spec = {"workflow": "w", "steps": {"a": NOOP, "b": {**NOOP, "after": ["a"]},
                                       "c": {**NOOP, "after": ["b"]}}}
    first = submit(dsn, store, spec, objects)
    run_all(store, objects, fails=lambda j: j == first.steps["b"].job_id)
    submit(dsn, store, spec, objects)  # the next one, still running
    got = {(s.name, tuple(s.labels.values())): s.value
           for m in StoreCollector(store, runs=False).collect() for s in m.samples}
    assert got["jobfence_workflows", ("failed",)] == 1
    assert got["jobfence_workflows", ("running",)] == 1
    assert got["jobfence_workflow_last_steps_failed", ("w", "failed")] == 2
    assert got["jobfence_workflow_last_duration_seconds", ("w", "failed")] > 0


def test_a_retry_refused_for_one_step_retries_none(dsn: str, store: Store) -> None:
    """A step whose cancelled attempt is still stopping cannot run again yet: the retry is
    refused whole, naming it — no step moved, the workflow still cancelled."""
    objects = objects_with(2)
    done = submit(dsn, store, etl(), objects)
    store.attempts.claim(worker_id="w", lease_seconds=60)  # extract, running
    workflows.cancel(store, done.workflow_id, actor="ops", reason="oops")
    with pytest.raises(Conflict, match="step extract cannot run again yet: stopping"):
        workflows.retry(store, done.workflow_id, actor="ops", reason="again")
    row, steps = workflows.get(store, done.workflow_id)
    assert row.status == "cancelled" and {s.status for s in steps} == {"cancelled"}
