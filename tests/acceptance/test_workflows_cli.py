"""Workflows through the real CLI: `enqueue --spec` of a workflow answers its id and each
step's job, a worker runs the steps in order, `workflow status|list` say where it stands;
cancelling a workflow stops a running step's command through the cancel path (the process
gone); every bad workflow — a cycle, an unknown or duplicate step, too many steps, a
workflow in a list — is exit 2 with nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devtools.sqlconn import connect
from jobfence.adapters.s3 import S3ObjectStore
from jobfence.objectstore import parse_s3_url
from tests.support import run_cli
from tests.support.procs import FAST, kill_quietly, read_pid, spawn, wait_for

NOOP = {"actions": [{"name": "sleep", "params": {"seconds": 0}}]}


def counts(dsn: str) -> tuple[int, ...]:
    with connect(dsn) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM jobs) AS j, "
                           "(SELECT count(*) FROM workflows) AS w, "
                           "(SELECT count(*) FROM control_events) AS c").fetchone()
    assert row is not None
    return tuple(row.values())


def submit(dsn: str, spec: object) -> dict[str, Any]:
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(spec))
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def status(dsn: str, workflow_id: str) -> dict[str, Any]:
    r = run_cli(dsn, "workflow", "status", workflow_id, "-o", "json")
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def test_a_workflow_is_submitted_run_and_shown(dsn: str) -> None:
    spec = {"workflow": "report", "steps": {
        "fetch": NOOP, "render": {**NOOP, "after": ["fetch"]},
        "mail": {**NOOP, "after": ["render"]}}}
    out = submit(dsn, spec)
    assert set(out) == {"workflow_id", "workflow", "steps"}
    assert {k: v["status"] for k, v in out["steps"].items()} == {
        "fetch": "pending", "render": "waiting", "mail": "waiting"}
    r = run_cli(dsn, "worker", "--max-jobs", "3", "--idle-seconds", "2", **FAST)
    assert r.returncode == 0, r.stderr
    view = status(dsn, out["workflow_id"])
    assert view["status"] == "succeeded" and view["steps_succeeded"] == 3
    assert list(view["steps"]) == ["fetch", "render", "mail"]
    assert {s["job_id"] for s in view["steps"].values()} == {
        s["job_id"] for s in out["steps"].values()}
    text = run_cli(dsn, "workflow", "status", out["workflow_id"]).stdout
    assert "SUCCEEDED" in text and "render" in text
    listed = json.loads(run_cli(dsn, "workflow", "list", "-o", "json").stdout)
    assert [v["workflow_id"] for v in listed] == [out["workflow_id"]]
    assert listed[0]["status"] == "succeeded" and listed[0]["steps"] == view["steps"]
    job = json.loads(run_cli(dsn, "status", out["steps"]["mail"]["job_id"], "-o",
                             "json").stdout)
    assert job["status"] == "succeeded"


def sh(script: str) -> dict[str, Any]:
    return {"actions": [{"name": "command", "params": {"argv": ["sh", "-c", script]}}]}


def test_a_step_gets_the_files_the_steps_before_it_wrote(dsn: str,
                                                         s3_env: dict[str, str]) -> None:
    """Real workers, moto's S3: extract writes three partitions, transform fans out over
    them (a datum each, made when it starts), load's command finds extract's files and
    every datum's in its input directory under each step's name, and what load writes is
    handed to report in turn; transform's manifest names each datum's input."""
    store = S3ObjectStore(endpoint_url=s3_env["JOBFENCE_S3_ENDPOINT_URL"])
    spec = {"workflow": "handoff", "steps": {
        "extract": sh('for i in 0 1 2; do echo "row $i" > "$JOBFENCE_OUTPUT_DIR/part-$i.txt"; '
                      'done'),
        "transform": {**sh('for f in "$JOBFENCE_INPUT_DIR"/extract/*; do tr a-z A-Z < "$f" > '
                           '"$JOBFENCE_OUTPUT_DIR/$(basename "$f" .txt).out"; done'),
                      "inputs": {"steps": ["extract"], "per_datum": 1}},
        "load": {**sh('cd "$JOBFENCE_INPUT_DIR" && find . -type f | sort > '
                      '"$JOBFENCE_OUTPUT_DIR/ls" && cat transform/*.out > '
                      '"$JOBFENCE_OUTPUT_DIR/rows"'),
                 "inputs": {"steps": ["extract", "transform"]}},
        "report": {**sh('cat "$JOBFENCE_INPUT_DIR/load/rows" > "$JOBFENCE_OUTPUT_DIR/report"'),
                   "inputs": {"steps": ["load"]}}}}
    r = run_cli(dsn, "enqueue", "--spec", "-", input=json.dumps(spec), **s3_env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    r = run_cli(dsn, "worker", "--max-jobs", "6", "--idle-seconds", "3", **FAST, **s3_env)
    assert r.returncode == 0, r.stderr
    view = status(dsn, out["workflow_id"])
    assert view["status"] == "succeeded", view
    assert view["steps"]["transform"]["fan_out"] and view["steps"]["transform"][
        "inputs_handed"] == 3
    assert view["steps"]["load"]["inputs_from"] == ["extract", "transform"]
    assert view["steps"]["load"]["inputs_handed"] == 6

    def output(step: str, path: str) -> str:
        with connect(dsn) as conn:
            row = conn.execute("SELECT o.url FROM job_outputs o JOIN jobs j USING (job_id) "
                               "WHERE j.step = %s AND o.path = %s AND o.status = 'done'",
                               (step, path)).fetchone()
        assert row is not None, (step, path)
        return store.get_bytes(*parse_s3_url(row["url"])).decode()

    assert output("load", "ls").split() == [
        *(f"./extract/part-{i}.txt" for i in range(3)),
        *(f"./transform/part-{i}.out" for i in range(3))]
    assert output("report", "report") == "ROW 0\nROW 1\nROW 2\n"
    transform = json.loads(run_cli(dsn, "status", out["steps"]["transform"]["job_id"], "-o",
                                   "json").stdout)
    manifest = json.loads(store.get_bytes(*parse_s3_url(transform["manifest"])))
    assert sorted(len(i["inputs"]) for i in manifest["items"]) == [1, 1, 1]
    assert all(i["inputs"][0].endswith(".txt") for i in manifest["items"])


def test_cancel_stops_a_running_steps_command(dsn: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "step.pid"
    spec = {"workflow": "long", "steps": {
        "work": {"actions": [{"name": "command", "params": {
            "argv": ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"]}}]},
        "after-work": {**NOOP, "after": ["work"]}}}
    out = submit(dsn, spec)
    worker = spawn(dsn, "worker", "--max-jobs", "1")
    try:
        pid = wait_for(lambda: read_pid(pidfile), timeout=30)
        r = run_cli(dsn, "workflow", "cancel", out["workflow_id"], "--reason", "wrong input")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["status"] == "cancelled"
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=15)
        worker.communicate(timeout=30)
    finally:
        kill_quietly(worker)
    view = status(dsn, out["workflow_id"])
    assert view["status"] == "cancelled"
    assert {s["status"] for s in view["steps"].values()} == {"cancelled"}
    assert "wrong input" in str(view["steps"]["work"]["error"])


def test_unknown_workflows_are_exit_5_and_bad_ids_exit_2(dsn: str) -> None:
    missing = "01a226d7-219f-726e-bc16-f8c4cfd64f5a"
    for verb in ("status", "cancel", "retry"):
        assert run_cli(dsn, "workflow", verb, missing).returncode == 5
        assert run_cli(dsn, "workflow", verb, "not-an-id").returncode == 2


STEPS_BAD: dict[str, Any] = {
    "a cycle": {"a": {**NOOP, "after": ["b"]}, "b": {**NOOP, "after": ["a"]}},
    "an unknown step": {"a": {**NOOP, "after": ["missing"]}},
    "a step after itself": {"a": {**NOOP, "after": ["a"]}},
    "too many steps": {f"s{i}": NOOP for i in range(1001)},
    "a bad job spec": {"a": {"actions": [{"name": "no-such-action"}]}},
    "no steps": {},
    "inputs from an unknown step": {"a": {**NOOP, "inputs": {"steps": ["missing"]}}},
}


@pytest.mark.parametrize("what", sorted(STEPS_BAD))
def test_bad_workflows_are_exit_2_and_write_nothing(dsn: str, what: str) -> None:
    before = counts(dsn)
    r = run_cli(dsn, "enqueue", "--spec", "-",
                input=json.dumps({"workflow": "w", "steps": STEPS_BAD[what]}))
    assert r.returncode == 2, (what, r.stdout, r.stderr)
    assert r.stderr.strip().splitlines()[-1].startswith("jobfence: error:"), r.stderr
    assert counts(dsn) == before


@pytest.mark.parametrize("text", [
    '{"workflow": "w", "steps": {"a": {"actions": [{"name": "sleep"}]}, '
    '"a": {"actions": [{"name": "sleep"}]}}}',
    "workflow: w\nsteps:\n  a: {actions: [{name: sleep}]}\n  a: {actions: [{name: sleep}]}\n",
    json.dumps([{"workflow": "w", "steps": {"a": NOOP}}]),
    json.dumps({"workflow": "w", "steps": {"a": {**NOOP, "workflow": "x"}}}),
])
def test_a_step_named_twice_or_a_workflow_in_a_list_is_exit_2(dsn: str, text: str) -> None:
    before = counts(dsn)
    r = run_cli(dsn, "enqueue", "--spec", "-", input=text)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert ("named twice" in r.stderr or "on its own" in r.stderr), r.stderr
    assert counts(dsn) == before


def test_a_drained_installation_refuses_a_workflow_and_writes_nothing(dsn: str) -> None:
    assert run_cli(dsn, "drain", "on", "--reason", "upgrade").returncode == 0
    before = counts(dsn)
    r = run_cli(dsn, "enqueue", "--spec", "-",
                input=json.dumps({"workflow": "w", "steps": {"a": NOOP}}))
    assert r.returncode != 0 and counts(dsn) == before
    assert "drain" in r.stderr


def test_a_job_outside_a_workflow_cannot_take_inputs_from_steps(dsn: str) -> None:
    before = counts(dsn)
    r = run_cli(dsn, "enqueue", "--spec", "-",
                input=json.dumps({**NOOP, "inputs": {"steps": ["extract"]}}))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "only a workflow's step takes them" in r.stderr
    assert counts(dsn) == before
