"""A workflow step's files handed to the step after it: the terminal write of a step that
wrote N files, with what it settles in the same transaction — the next step made pending
with the N files listed (`inputs: {steps: [extract]}`), or fanned out over them into N
datums (`per_datum: 1`) — beside the same write with nothing waiting on it. Medians of
alternated runs, each on a fresh database."""

from __future__ import annotations

import statistics
import time

from bench.common import Bench, Section
from devtools.sqlconn import connect

NOOP = {"actions": [{"name": "sleep", "params": {"seconds": 0}}]}


def terminal_write(bench: Bench, files: int, taken: dict[str, object] | None) -> float:
    """Seconds of the terminal write of ``extract`` (which wrote ``files`` files), the step
    after it taking them as ``taken`` says (no step after it when None)."""
    from jobfence import workflows
    from jobfence.settings import load_settings
    from jobfence.store import Store

    dsn = bench.database()
    steps: dict[str, object] = {"extract": NOOP}
    if taken is not None:
        steps["next"] = {**NOOP, "inputs": taken}
    with connect(dsn) as conn:
        store = Store(conn)
        workflows.submit_workflow(load_settings(database_url=dsn, s3_bucket="out"), store,
                                  workflows.parse_workflow({"workflow": "w", "steps": steps}),
                                  actor="bench")
        [c] = store.attempts.claim(worker_id="bench", lease_seconds=600)
        names = [f"part-{i:05d}.csv" for i in range(files)]
        if names:
            store.attempts.register_outputs(job_id=c.job_id, attempt_id=c.attempt_id,
                                            outputs=[(p, f"s3://out/x/{p}") for p in names])
            store.attempts.confirm_outputs(job_id=c.job_id, attempt_id=c.attempt_id, outputs=[
                {"path": p, "status": "done", "size_bytes": 1, "error": None} for p in names])
        started = time.perf_counter()
        assert store.attempts.finish(job_id=c.job_id, attempt_id=c.attempt_id,
                                     succeeded=True) is not None
        return time.perf_counter() - started


def run(bench: Bench) -> Section:
    sizes = [100, 1_000] if bench.quick else [100, 1_000, 10_000]
    rounds = 3 if bench.quick else 5
    kinds: list[tuple[str, dict[str, object] | None]] = [
        ("nothing after it", None),
        ("the next step takes them (one job)", {"steps": ["extract"]}),
        ("the next step fans out over them (a datum a file)",
         {"steps": ["extract"], "per_datum": 1}),
    ]
    s = Section("Workflows: a step's files handed to the step after it",
                "python -m bench.run --only handoff",
                ["files the step wrote", *(k for k, _ in kinds)])
    for n in sizes:
        samples: dict[str, list[float]] = {k: [] for k, _ in kinds}
        for _ in range(rounds):  # alternated
            for kind, taken in kinds:
                samples[kind].append(terminal_write(bench, n, taken))
        s.rows.append([f"{n:,}", *(f"{statistics.median(samples[k]) * 1000:,.1f} ms"
                                   for k, _ in kinds)])
    s.notes.append(
        "The terminal write of a step (one `worker_finish` call) and what it "
        "settles in its transaction: the next step's files listed from `job_outputs` into its "
        "row (`jobfence_step_inputs`), or its datums inserted (`jobfence_fan_out`) with their "
        "audit events. A step takes at most 10,000 files; the fan-out's cost is the datums' "
        f"inserts, as an enqueue's. Medians of {rounds} alternated runs.")
    return s
