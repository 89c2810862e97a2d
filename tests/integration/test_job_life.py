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
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from devtools.sqlconn import connect
from tests.model.machine import JobLife, seed_from_env
from tests.pg import Databases

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


@pytest.mark.timeout(900)
def test_a_broken_rule_is_found(databases: Databases) -> None:
    """The test can fail: with one function of its own database replaced by a broken one,
    the state machine finds a sequence that shows it."""
    found: list[str] = []
    with pytest.raises(BaseException):
        run_model(databases, examples=200, steps=30, run_seed=DEFAULT_SEED, shrink=False,
                  prepare=lambda conn: conn.execute(FENCELESS_HEARTBEAT), found=found)
    assert any(v.startswith("heartbeat disagrees with the fence") for v in found), found
