"""A real OpenTelemetry Collector for a test (devtools/otelcol, built once and cached): its
OTLP/HTTP receiver on a free port of 127.0.0.1, its file exporter writing every span it
receives to a file the test reads back."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools import otelcol
from tests.support.procs import kill_quietly
from tests.support.serving import free_port

CONFIG = """\
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  file:
    path: {path}
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
"""


@dataclass
class Span:
    """One span as the collector's file has it (OTLP JSON), with its resource's."""

    raw: dict[str, Any]
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.raw["name"])

    @property
    def trace_id(self) -> str:
        return str(self.raw["traceId"])

    @property
    def span_id(self) -> str:
        return str(self.raw["spanId"])

    @property
    def parent(self) -> str:
        return str(self.raw.get("parentSpanId", ""))

    @property
    def kind(self) -> int:
        return int(self.raw.get("kind", 0))

    @property
    def attributes(self) -> dict[str, Any]:
        return _attributes(self.raw.get("attributes", []))

    @property
    def links(self) -> list[dict[str, Any]]:
        return [{"trace_id": link["traceId"], "span_id": link["spanId"],
                 **_attributes(link.get("attributes", []))}
                for link in self.raw.get("links", [])]

    @property
    def error(self) -> bool:
        return self.raw.get("status", {}).get("code") == 2

    def is_parent_of(self, traceparent: str) -> bool:
        """Whether ``traceparent`` names this span, sampled (other flags may be set: the
        random trace id flag of Trace Context level 2)."""
        version, trace_id, span_id, flags = traceparent.split("-")
        return (version, trace_id, span_id) == ("00", self.trace_id, self.span_id) \
            and bool(int(flags, 16) & 1)


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for item in items:
        [(kind, value)] = item["value"].items() or [("", None)]
        out[item["key"]] = int(value) if kind == "intValue" else value  # JSON has int64 as text
    return out


@dataclass
class Collector:
    endpoint: str
    path: Path
    proc: subprocess.Popen[str]
    senders: str = ""
    """What the processes that sent spans said (the end of their logs), for a failed wait."""

    def spans(self) -> list[Span]:
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line).get("resourceSpans", []):
                resource = _attributes(rs.get("resource", {}).get("attributes", []))
                for ss in rs.get("scopeSpans", []):
                    found += [Span(s, resource) for s in ss.get("spans", [])]
        return found

    def wait(self, done: Callable[[list[Span]], bool], timeout: float = 20) -> list[Span]:
        """The spans, once ``done`` says they are all there."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = [(s.name, s.resource.get("service.name")) for s in spans]
                raise AssertionError(f"the collector has not received them in {timeout}s: "
                                     f"{names}; its senders said:\n{self.senders}")
            time.sleep(0.1)

    @property
    def env(self) -> dict[str, str]:
        """What a process exporting to this collector is given: the standard variables,
        and batches sent within a tenth of a second."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


@contextmanager
def collector(directory: Path) -> Iterator[Collector]:
    binary = otelcol.build()  # at once when cached (make test builds it first)
    port = free_port()
    path = directory / "spans.jsonl"
    config = directory / "otelcol.yaml"
    config.write_text(CONFIG.format(port=port, path=path))
    log = (directory / "otelcol.log").open("w")
    proc = subprocess.Popen([str(binary), "--config", str(config)], stdout=log, stderr=log,
                            text=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # ready when the receiver answers (405: it takes POST only)
            if proc.poll() is not None:
                raise AssertionError(f"the collector exited {proc.returncode}: "
                                     f"{(directory / 'otelcol.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(endpoint + "/v1/traces", timeout=1)
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield Collector(endpoint, path, proc)
    finally:
        kill_quietly(proc)
        log.close()
