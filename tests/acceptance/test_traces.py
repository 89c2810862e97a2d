"""Traces through a real OpenTelemetry Collector (devtools/otelcol), read back from the file
its exporter writes: an application's request to the HTTP API (with its traceparent), and an
application's own span around the Python API, each one trace through the enqueue, the
worker's attempt and each action, the command seeing its action's span as TRACEPARENT; a
retry's attempt a trace of its own linked to the first attempt and to the enqueue; a job a
schedule enqueued, in the trace of the schedules pass that enqueued it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, cli_env, role_dsn, run_cli
from tests.support.collector import Collector, Span, collector
from tests.support.procs import FAST, action_results
from tests.support.serving import Served, free_port, serve

PRODUCER, CONSUMER, INTERNAL = 4, 5, 1  # OTLP's span kinds
APP_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
APP_SPAN = "00f067aa0ba902b7"
PROXY = {"JOBFENCE_AUTH": "proxy", "JOBFENCE_AUTH_OPERATORS": "alice"}
ECHO = {"name": "command",
        "params": {"argv": ["sh", "-c", 'printf %s "$TRACEPARENT"']}}


@pytest.fixture
def otel(tmp_path: Path) -> Iterator[Collector]:
    with collector(tmp_path) as c:
        yield c


@pytest.fixture
def server(dsn: str, tmp_path: Path, otel: Collector) -> Iterator[Served]:
    with serve(dsn, **PROXY, **otel.env, OTEL_SERVICE_NAME="shop-jobs-api",
               TMPDIR=str(tmp_path)) as s:
        yield s


def work(dsn: str, otel: Collector, jobs: int = 1) -> None:
    r = run_cli(dsn, "worker", "--max-jobs", str(jobs), **FAST, **otel.env)
    otel.senders += r.stderr[-4000:]
    assert r.returncode in (0, 1), r.stderr
    assert "traces_not_exported" not in r.stderr


def named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def one_trace_through(spans: list[Span], job_id: str, parent: str) -> dict[str, Span]:
    """The enqueue, the attempt and its actions of ``job_id``: one trace, each span the
    child of the one before it (the actions of the attempt), the enqueue's of ``parent``."""
    [enqueue] = [s for s in named(spans, "enqueue default")
                 if s.attributes["jobfence.job.id"] == job_id]
    [attempt] = [s for s in named(spans, "process default")
                 if s.attributes["jobfence.job.id"] == job_id]
    actions = sorted((s for s in spans if s.parent == attempt.span_id),
                     key=lambda s: s.attributes["jobfence.action.index"])
    assert enqueue.kind == PRODUCER and enqueue.parent == parent
    assert attempt.kind == CONSUMER and attempt.parent == enqueue.span_id
    assert attempt.trace_id == enqueue.trace_id
    assert attempt.attributes["jobfence.attempt.number"] == 1
    assert attempt.attributes["jobfence.outcome"] == "succeeded" and not attempt.error
    assert [(s.name, s.kind, s.trace_id) for s in actions] == [
        ("action sleep", INTERNAL, enqueue.trace_id),
        ("action command", INTERNAL, enqueue.trace_id)]
    assert attempt.resource["jobfence.function"] == "worker"
    return {"enqueue": enqueue, "attempt": attempt, "sleep": actions[0],
            "command": actions[1]}


def test_an_api_request_is_one_trace_through_enqueue_attempt_and_actions(
        server: Served, dsn: str, otel: Collector) -> None:
    spec = {"actions": [{"name": "sleep", "params": {"seconds": 0}}, ECHO]}
    r = server.post("/api/v1/jobs", spec, headers={
        "X-Forwarded-User": "alice", "traceparent": f"00-{APP_TRACE}-{APP_SPAN}-01"})
    assert r.status == 202, r.body
    job_id = r.body["job_id"]
    work(dsn, otel)
    spans = otel.wait(lambda s: len(named(s, "enqueue default")) == 1
                      and len(named(s, "action command")) == 1)
    trace = one_trace_through(spans, job_id, parent=APP_SPAN)
    assert trace["enqueue"].trace_id == APP_TRACE
    assert trace["enqueue"].resource["service.name"] == "shop-jobs-api"  # OTEL_SERVICE_NAME
    assert trace["attempt"].resource["service.name"] == "jobfence"
    # The command saw its own action's span as its parent.
    [_, echoed] = action_results(dsn, job_id)
    assert trace["command"].is_parent_of(echoed["result"]["stdout_tail"])


APPLICATION = r"""
import sys
import psycopg
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
import jobfence

provider = TracerProvider(resource=Resource({"service.name": "shop"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
spec = {"actions": [{"name": "sleep", "params": {"seconds": 0}}, %s]}
with psycopg.connect(sys.argv[1]) as conn:
    with trace.get_tracer("shop").start_as_current_span("POST /orders") as span:
        with conn.transaction():
            [job] = jobfence.enqueue(conn, spec)
provider.shutdown()
ctx = span.get_span_context()
print(job["job_id"], format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"))
"""


def test_an_applications_span_around_the_python_api_is_one_trace_to_the_command(
        dsn: str, otel: Collector) -> None:
    env = {**cli_env(dsn), **otel.env}
    out = subprocess.run([sys.executable, "-c", APPLICATION % json.dumps(ECHO),
                          role_dsn(dsn, "enqueue")], env=env, cwd=REPO, text=True,
                         capture_output=True, check=True, timeout=60)
    job_id, trace_id, span_id = out.stdout.split()
    work(dsn, otel)
    spans = otel.wait(lambda s: bool(named(s, "POST /orders"))
                      and len(named(s, "action command")) == 1)
    [request] = named(spans, "POST /orders")
    assert (request.trace_id, request.span_id) == (trace_id, span_id)
    trace = one_trace_through(spans, job_id, parent=request.span_id)
    assert trace["enqueue"].resource["service.name"] == "shop"  # the application's provider
    [_, echoed] = action_results(dsn, job_id)
    assert trace["command"].is_parent_of(echoed["result"]["stdout_tail"])


def test_a_retry_is_a_trace_of_its_own_linked_to_the_first_attempt(
        dsn: str, otel: Collector) -> None:
    """Enqueued by a script that runs in a trace of its own (TRACEPARENT, as OpenTelemetry
    hands a context to a child process); the job fails twice."""
    caller = f"00-{APP_TRACE}-{APP_SPAN}-01"
    r = run_cli(dsn, "enqueue", "command:" + json.dumps({"argv": ["false"]}),
                "--max-attempts", "2", TRACEPARENT=caller, **otel.env)
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["job_id"]
    work(dsn, otel, jobs=2)
    spans = otel.wait(lambda s: len(named(s, "process default")) == 2)
    [enqueue] = named(spans, "enqueue default")
    assert (enqueue.trace_id, enqueue.parent) == (APP_TRACE, APP_SPAN)
    first, second = sorted(named(spans, "process default"),
                           key=lambda s: s.attributes["jobfence.attempt.number"])
    assert first.attributes["jobfence.job.id"] == second.attributes["jobfence.job.id"] == job_id
    assert (first.trace_id, first.parent) == (APP_TRACE, enqueue.span_id)
    assert second.trace_id != APP_TRACE and second.parent == ""  # a root of its own
    assert second.links == [
        {"trace_id": APP_TRACE, "span_id": first.span_id, "jobfence.link": "first_attempt"},
        {"trace_id": APP_TRACE, "span_id": enqueue.span_id, "jobfence.link": "enqueue"}]
    assert (first.attributes["jobfence.outcome"], first.error) == ("retry", True)
    assert (second.attributes["jobfence.outcome"], second.error) == ("failed", True)
    [failed] = [s for s in named(spans, "action command") if s.parent == second.span_id]
    assert failed.error and failed.trace_id == second.trace_id


def test_a_collector_that_does_not_answer_costs_the_job_nothing(dsn: str) -> None:
    """Spans that cannot be exported are logged as the worker's own JSON lines; the job
    succeeds, and the worker waits for the export no longer than its bound."""
    job_id = json.loads(run_cli(dsn, "enqueue", 'sleep:{"seconds": 0}').stdout)["job_id"]
    started = time.monotonic()
    r = run_cli(dsn, "worker", **FAST, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",
                JOBFENCE_TRACING_FLUSH_SECONDS="1")
    took = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["jobs"] == [{"job_id": job_id, "outcome": "succeeded"}]
    lines = r.stderr.splitlines()
    assert all(line.startswith("{") for line in lines), r.stderr  # JSON lines only
    assert any('"traces_not_exported"' in line for line in lines), r.stderr
    assert took < 8, took  # the exporter alone would retry for 10 s


def test_a_variable_jobfence_cannot_honour_is_refused_before_any_work(dsn: str) -> None:
    r = run_cli(dsn, "worker", OTEL_TRACES_EXPORTER="zipkin")
    assert r.returncode == 2 and "OTEL_TRACES_EXPORTER" in r.stderr


def test_a_scheduled_job_joins_the_trace_of_the_pass_that_enqueued_it(
        dsn: str, otel: Collector, tmp_path: Path) -> None:
    from devtools.sqlconn import connect

    spec = tmp_path / "nightly.json"
    spec.write_text(json.dumps({"actions": [ECHO]}))
    added = run_cli(dsn, "schedule", "add", "nightly", "--cron", "0 3 * * *", "--spec",
                    str(spec))
    assert added.returncode == 0, added.stderr
    with connect(dsn) as conn:  # its tick came while nothing ran
        conn.execute("UPDATE schedules SET next_tick_at = now() - interval '1 minute'")
    fired = run_cli(dsn, "schedules", **otel.env)
    assert fired.returncode == 0, fired.stderr
    work(dsn, otel)
    spans = otel.wait(lambda s: len(named(s, "process default")) == 1)
    [enqueue] = named(spans, "enqueue default")
    [attempt] = named(spans, "process default")
    assert enqueue.kind == PRODUCER and enqueue.resource["jobfence.function"] == "schedules"
    assert (attempt.trace_id, attempt.parent) == (enqueue.trace_id, enqueue.span_id)
    with connect(dsn) as conn:
        [row] = conn.execute("SELECT job_id, traceparent FROM jobs").fetchall()
    assert enqueue.is_parent_of(row["traceparent"])  # stored with the job
    [result] = [r["result"] for r in action_results(dsn, str(row["job_id"]))]
    assert result["stdout_tail"].split("-")[1] == enqueue.trace_id  # the command's TRACEPARENT


def test_a_snooze_is_no_error_in_the_trace(dsn: str, otel: Collector) -> None:
    snooze = ('printf PT1H > "$JOBFENCE_SNOOZE_FILE"; exit 75')
    r = run_cli(dsn, "enqueue", "command:" + json.dumps({"argv": ["sh", "-c", snooze]}),
                **otel.env)
    assert r.returncode == 0, r.stderr
    work(dsn, otel)
    spans = otel.wait(lambda s: len(named(s, "action command")) == 1)
    [attempt] = named(spans, "process default")
    [action] = named(spans, "action command")
    assert attempt.attributes["jobfence.outcome"] == "snoozed" and not attempt.error
    assert action.attributes["jobfence.action.snoozed_seconds"] == 3600 and not action.error
