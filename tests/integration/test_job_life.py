"""A job's life, checked against its reference model (tests/model): hypothesis drives the
real store on a real PostgreSQL through random sequences of every verb — enqueue with
``after``, claims by several workers, heartbeats, action results and outputs, finish,
failures with retries, snooze, SIGTERM, cancel and stopping, retry one by one and in bulk,
expiry, pause and limits, leases running out on a clock the test moves, the sweeper,
export-finalize and orphan-cleanup, datum parents — and after every step compares the
database with the model and checks every invariant (tests/model/machine.py lists them).

``make test`` runs a modest number of sequences from a fixed seed; ``make model-check``
runs thousands from a fresh one (``JOBFENCE_MODEL_EXAMPLES``, ``JOBFENCE_MODEL_SEED``). A
failure prints the seed and the shrunk sequence of steps that breaks the rule.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from devtools.sqlconn import connect
from tests.model.machine import JobLife, seed_from_env
from tests.support.pg import Databases

DEFAULT_SEED = 39
"""The seed ``make test`` runs with, so that the suite is the same run to run."""


def run_model(databases: Databases, *, examples: int, steps: int, run_seed: int,
              prepare: Callable[[Any], None] | None = None, shrink: bool = True,
              found: list[str] | None = None) -> None:
    """Run the state machine: ``examples`` sequences of up to ``steps`` steps on a fresh
    database of the test's own (``prepare`` runs on it first), emptied before each; on
    failure the exception carries the seed that reproduces it."""

    url = databases.create()
    if prepare is not None:
        with connect(url) as conn:
            prepare(conn)

    class Machine(JobLife):
        pass

    Machine.url = url
    Machine.found = [] if found is None else found

    def factory() -> Machine:
        return Machine()

    try:
        run_state_machine_as_test(seed(run_seed)(factory), settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
            print_blob=True, suppress_health_check=list(HealthCheck),
            phases=list(Phase) if shrink else [Phase.explicit, Phase.generate],
            report_multiple_bugs=shrink))
    except BaseException as exc:
        exc.add_note(f"jobfence model: seed {run_seed}; reproduce with "
                     f"JOBFENCE_MODEL_SEED={run_seed} JOBFENCE_MODEL_EXAMPLES={examples}")
        raise
    finally:
        databases.drop(url)


# A failure is shrunk (hypothesis gives that up to 5 minutes); the long mode has no bound.
@pytest.mark.timeout(int(os.environ.get("JOBFENCE_MODEL_TIMEOUT", "900")))
def test_every_sequence_of_verbs_agrees_with_the_model(databases: Databases) -> None:
    examples = int(os.environ.get("JOBFENCE_MODEL_EXAMPLES", "20"))
    run_seed = seed_from_env()
    if run_seed is None:
        run_seed = DEFAULT_SEED if examples <= 100 else random.randrange(2**32)
    print(f"jobfence model: {examples} sequences, seed {run_seed}")
    started = time.monotonic()
    run_model(databases, examples=examples,
              steps=int(os.environ.get("JOBFENCE_MODEL_STEPS", "40")), run_seed=run_seed)
    print(f"jobfence model: seed {run_seed}: {JobLife.runs['sequences']} sequences, "
          f"{JobLife.runs['steps']} steps, {JobLife.runs['jobs']} jobs, 0 violations, "
          f"{time.monotonic() - started:.0f} s")


# A heartbeat that forgets the fence: it renews the lease of whatever job it names, whoever
# holds it and whatever its state (the store's own checks the attempt and a live lease).
FENCELESS_HEARTBEAT = """
CREATE OR REPLACE FUNCTION worker_heartbeat_many(p_job_ids uuid[], p_attempt_ids uuid[],
                                                 p_lease_seconds double precision)
RETURNS TABLE(job_id uuid, lease_expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path = jobfence, pg_temp AS $$
    UPDATE jobs j SET visible_at = now() + make_interval(secs => p_lease_seconds),
                      heartbeat_at = now()
    WHERE j.job_id = ANY(p_job_ids)
    RETURNING j.job_id, j.visible_at
$$"""


# The search for a broken rule is long (a few hundred sequences find this one): `make
# model-check` runs it beside the long model run; `make test` judges the sequence it finds.
@pytest.mark.model_search
@pytest.mark.timeout(1800)
def test_a_broken_rule_is_found(databases: Databases) -> None:
    """The test can fail: with one function of its own database replaced by a broken one,
    the state machine finds a sequence that shows it."""
    # The claim takes jobs ready at the same instant in whatever order the server finds
    # them, so one seed's sequences can differ from run to run: a search that found it on
    # one machine missed it on another. A few seeds, stopping at the first that finds it.
    found: list[str] = []
    for run_seed in range(DEFAULT_SEED, DEFAULT_SEED + 5):
        try:
            run_model(databases, examples=200, steps=30, run_seed=run_seed, shrink=False,
                      prepare=lambda conn: conn.execute(FENCELESS_HEARTBEAT), found=found)
        except BaseException:  # what it found is judged below
            break
    assert any(v.startswith("heartbeat disagrees with the fence") for v in found), found


def _do(m: JobLife, rule: str, *args: Any) -> Any:
    """Run one rule of the machine (without hypothesis' wrapping), then judge the store as
    the state machine does after every step."""
    fn = getattr(JobLife, rule)
    out = getattr(fn, "__wrapped__", fn)(m, *args)
    m.judge()
    return out


@contextmanager
def scripted(databases: Databases, prepare: str | None = None) -> Iterator[JobLife]:
    """A machine on a fresh database of its own (``prepare`` run on it first) for a sequence
    written out step by step (``_do``); torn down and dropped afterwards."""
    url = databases.create()
    if prepare is not None:
        with connect(url) as conn:
            conn.execute(prepare)

    class Machine(JobLife):
        pass

    Machine.url = url
    Machine.found = []
    m = Machine()
    try:
        yield m
    finally:
        m.teardown()
        databases.drop(url)


def _expiry(m: JobLife) -> None:
    j = _do(m, "enqueue", "q1", None, [False], 3, [], 0, 2)  # expires in 2 ticks
    _do(m, "claim", "w1", "q1")
    _do(m, "work", "w1", "fail")  # started, back to pending
    _do(m, "advance", 2)
    _do(m, "periodic", "lifecycle")
    assert m.model.jobs[j].status == "pending"


def _limit(m: JobLife) -> None:
    _do(m, "configure", "q1", 1)
    a = _do(m, "enqueue", "q1", None, [False], 3, [], 0, None)
    _do(m, "enqueue", "q1", None, [False], 3, [], 0, None)
    _do(m, "claim", "w1", "q1")
    _do(m, "cancel", a)  # its command still stopping: it keeps its slot
    _do(m, "claim", "w2", "q1")
    assert "w2" not in m.held


def _resume_after_retry(m: JobLife) -> None:
    a = _do(m, "enqueue", "q1", None, [False, False], 1, [], 0, None)
    _do(m, "claim", "w1", "q1")
    _do(m, "work", "w1", "ok")  # action 0 succeeds
    _do(m, "work", "w1", "fail")  # action 1 fails: failed, attempts spent
    _do(m, "retry", a)
    _do(m, "claim", "w1", "q1")
    _do(m, "work", "w1", "sigterm")  # given back before any action
    _do(m, "claim", "w1", "q1")
    _do(m, "work", "w1", "ok")  # starts again from action 0


def _retry_with_dependency(m: JobLife) -> None:
    first = _do(m, "enqueue", "q1", None, [False], 1, [], 0, None)
    then = _do(m, "enqueue", "q1", None, [True], 1, [first], 0, None)
    _do(m, "cancel", first)  # the dependent fails, naming it
    _do(m, "bulk_retry", [then])
    _do(m, "retry", then)
    assert m.model.jobs[then].status == "failed"


def _outputs_of_a_resumed_job(m: JobLife) -> None:
    a = _do(m, "enqueue", "q1", None, [True, False], 2, [], 0, None)
    _do(m, "claim", "w1", "q1")
    _do(m, "work", "w1", "ok")  # action 0 writes its output
    _do(m, "work", "w1", "sigterm")
    _do(m, "claim", "w1", "q1")
    _do(m, "work", "w1", "ok")  # resumes at action 1: succeeded
    _do(m, "periodic", "orphan-cleanup")  # the first attempt's output is kept
    assert m.model.jobs[a].status == "succeeded"


@pytest.mark.parametrize("sequence", [_expiry, _limit, _resume_after_retry,
                                      _retry_with_dependency, _outputs_of_a_resumed_job],
                         ids=lambda f: f.__name__.strip("_"))
def test_the_model_s_found_sequences(databases: Databases,
                                     sequence: Callable[[JobLife], None]) -> None:
    """The sequences the model found on the store before these rules were fixed (issue 39),
    each judged after every step as the state machine judges it: expiry of a job that
    started; a limit-1 queue running a second job while the first's cancelled command still
    stopped; a retried job resuming after actions that succeeded before the retry; a retry
    making a job with a cancelled dependency pending; a resumed job's output deleted by
    orphan-cleanup."""
    with scripted(databases) as m:
        m.judge()
        sequence(m)
    assert m.found == []


def test_a_broken_rule_s_sequence_is_judged_a_violation(databases: Databases) -> None:
    """The judge the search relies on: with the heartbeat that forgets the fence, the
    sequence the search finds (a worker's lease runs out, another worker takes the job, the
    first one's guard renews it) is a violation, named after its rule."""
    with scripted(databases, prepare=FENCELESS_HEARTBEAT) as m:
        _do(m, "enqueue", "q1", None, [False], 3, [], 0, None)
        _do(m, "claim", "w1", "q1")
        _do(m, "advance", 2)  # w1's lease is over
        _do(m, "claim", "w2", "q1")  # the job again, under a new fence
        with pytest.raises(Exception, match="heartbeat disagrees with the fence"):
            _do(m, "guard", "w1", "heartbeat")
    assert [v.split(":")[0] for v in m.found] == ["heartbeat disagrees with the fence"]


def test_a_job_and_its_dependent_expiring_in_one_pass_are_both_expired(
        databases: Databases) -> None:
    """A job waiting on one that expires, itself past its own expiry in the same pass, is
    expired too (cancelled), not failed for its dependency: the long run's seed 31415926
    found the model deciding otherwise."""
    with scripted(databases) as m:
        first = _do(m, "enqueue", "q1", None, [False], 1, [], 0, 1)
        then = _do(m, "enqueue", "q1", None, [False], 1, [first], 0, 1)
        _do(m, "advance", 1)
        _do(m, "periodic", "lifecycle")
        assert m.model.jobs[then].status == "cancelled"
    assert m.found == []
