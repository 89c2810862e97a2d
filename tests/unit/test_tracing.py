"""The parts of tracing that need no SDK: reading a traceparent as the W3C Trace Context
says a receiver reads one, the ids derived for attempts, when a process traces; and that a
process that does not trace — or traces but makes no span — imports nothing of
OpenTelemetry. The spans themselves are tested against a real collector
(tests/acceptance/test_traces.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from uuid import UUID, uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobfence.errors import ConfigError
from jobfence.tracecontext import TraceParent, attempt_span_id, job_trace_id, parse_traceparent
from jobfence.tracing import check_environment, configured
from tests.support import REPO

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_traceparent_reads_back_as_written() -> None:
    parsed = parse_traceparent(TP)
    assert parsed == TraceParent(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1)
    assert parsed is not None and parsed.sampled and str(parsed) == TP
    unsampled = parse_traceparent(TP[:-2] + "00")
    assert unsampled is not None and not unsampled.sampled


@pytest.mark.parametrize("value", [
    None, "", "00", TP.upper(), TP + "-", TP + "-extra",  # version 00 has four fields exactly
    "ff" + TP[2:],  # the one invalid version
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
    "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
    "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
    "0x-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "01-" + TP[3:] + "-" + "x" * 600,  # longer than any header is read
])
def test_what_is_not_a_traceparent_is_ignored(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_is_read_for_its_four_first_fields() -> None:
    assert str(parse_traceparent("cc-" + TP[3:] + "-what-comes-later")) == TP
    assert str(parse_traceparent("  " + TP + "\t")) == TP  # optional white space around


@given(st.text(max_size=80))
def test_any_text_parses_to_a_traceparent_or_none(text: str) -> None:
    parsed = parse_traceparent(text)
    if parsed is not None:
        assert parse_traceparent(str(parsed)) == parsed


def test_ids_derived_for_attempts_and_untraced_jobs() -> None:
    a, b = uuid4(), uuid4()
    assert attempt_span_id(a) == attempt_span_id(UUID(str(a)))  # any worker derives the same
    assert attempt_span_id(a) != attempt_span_id(b)
    assert 0 < attempt_span_id(a) < 2**64
    assert 0 < job_trace_id(a) < 2**128
    assert job_trace_id(a) >> 64 != attempt_span_id(a)  # not the same digest reused


@pytest.mark.parametrize(("mode", "env", "traces"), [
    ("auto", {}, False),
    ("auto", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ("auto", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ("auto", {"OTEL_TRACES_EXPORTER": "console"}, True),
    ("auto", {"OTEL_TRACES_EXPORTER": "none",
              "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
    ("auto", {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ("auto", {"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ("on", {}, True),
    ("on", {"OTEL_SDK_DISABLED": "TRUE"}, False),
    ("off", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
])
def test_when_a_process_traces(mode: str, env: dict[str, str], traces: bool) -> None:
    assert configured(mode, env) is traces  # type: ignore[arg-type]


@pytest.mark.parametrize(("env", "refused"), [
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, None),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, None),
    ({"OTEL_TRACES_EXPORTER": "otlp,jaeger"}, "OTEL_TRACES_EXPORTER"),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
])
def test_what_jobfence_cannot_honour_is_said_at_start(env: dict[str, str],
                                                      refused: str | None) -> None:
    if refused is None:
        check_environment(env)
    else:
        with pytest.raises(ConfigError, match=refused):
            check_environment(env)


# What a process that does not trace loads: the worker, the API and the server's modules, a
# producer "span" at enqueue, an attempt and an action, the child's environment.
PROBE = r"""
import json, sys, uuid
from jobfence import api, tracing
from jobfence.console import api as http_api
from jobfence.functions import worker, enqueue, serve
from jobfence.settings import load_settings
from jobfence.store.types import Claim, NewJob
settings = load_settings()
tracing.setup(settings, "worker")
job = NewJob(job_id=uuid.uuid4(), actions=[], max_attempts=1)
with tracing.enqueue_span(settings, sys.argv[1]) as traced:
    traced.sent([job])
    stored = traced.traceparent
claim = Claim(uuid.uuid4(), uuid.uuid4(), 1, 1, [], None, None, None, None)
with tracing.attempt_span(lambda read: None, claim, "default") as span:
    with tracing.action_span(0, "sleep"):
        env = tracing.child_env()
    span.ended("succeeded")
tracing.flush()
print(json.dumps({"stored": stored, "env": env,
                  "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
"""


def probe(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OTEL_", "JOBFENCE_", "TRACEPARENT"))}
    out = subprocess.run([sys.executable, "-c", PROBE, TP], cwd=REPO, capture_output=True,
                         text=True, check=True,
                         env={**clean, "JOBFENCE_DATABASE_URL": "dbname=none", **env})
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize("env", [
    {},  # not configured
    {"JOBFENCE_TRACING": "off", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
])
def test_nothing_of_opentelemetry_is_imported_when_tracing_is_off(env: dict[str, str]) -> None:
    # The caller's traceparent is still kept for the jobs (a tracing worker joins it), and
    # the command gets no TRACEPARENT.
    assert probe(**env) == {"stored": TP, "env": {}, "otel": []}


def test_a_command_that_makes_no_span_imports_nothing_even_when_tracing_is_on() -> None:
    """``status`` sets tracing up (the variables ask for it) but makes no span: the SDK is
    configured on the first span only."""
    code = ("import atexit, sys; from jobfence.functions import cli; atexit.register(lambda: "
            "print(any(m.startswith('opentelemetry') for m in sys.modules))); "
            "sys.argv = ['jobfence', 'status', sys.argv[1]]; cli.run()")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    out = subprocess.run([sys.executable, "-c", code, str(uuid4())], cwd=REPO,
                         capture_output=True, text=True, check=False,
                         env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                              "JOBFENCE_DATABASE_URL": "postgresql://127.0.0.1:9/none",
                              "JOBFENCE_CONNECT_TIMEOUT_SECONDS": "1"})
    assert out.returncode == 4, out.stderr  # it ran as far as the database
    assert out.stdout.strip() == "False", out.stderr
