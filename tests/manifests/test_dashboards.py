"""The Grafana dashboards (manifests/components/grafana-dashboards): the committed JSON is
what devtools/dashboards.py writes; each loads as Grafana dashboard JSON (schema version,
unique panel ids, a datasource variable every panel uses); every panel's expression parses
as PromQL and names only metrics jobfence exports; the component renders as the sidecar's
ConfigMap."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from devtools.dashboards import OUT, render
from tests.support.manifests import MANIFESTS, METRICS, metric_names
from tests.support.manifests import render as kustomize

DASHBOARDS = sorted(OUT.glob("*.json"))
# Grafana's own variables, given values PromQL can parse.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def expressions(board: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]


def as_promql(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return re.sub(r"\$\w+", ".*", expr)  # the dashboard's own variables: regex matchers


def test_the_committed_dashboards_are_what_the_source_writes() -> None:
    assert {p.name: p.read_text() for p in DASHBOARDS} == render()
    assert len(DASHBOARDS) == 3


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_each_dashboard_is_grafana_dashboard_json(path: Path) -> None:
    board = load(path)
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board["uid"] and board["title"] and isinstance(board["panels"], list)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    [ds] = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert ds["name"] == "datasource" and ds["query"] == "prometheus"
    names = {v["name"] for v in board["templating"]["list"]}
    for p in board["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p[
            "gridPos"]["w"] <= 24, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["refId"]
            used = set(re.findall(r"\$(\w+)", t["expr"])) - {"__rate_interval",
                                                             "__interval", "__range"}
            assert used <= names, (p["title"], used - names)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_expression_parses_and_names_only_exported_metrics(path: Path) -> None:
    for title, expr in expressions(load(path)):
        used = metric_names(promql_parser.parse(as_promql(expr)))
        assert used, (title, expr)
        assert used <= METRICS, (title, used - METRICS)


def test_the_component_renders_the_sidecars_configmap(tmp_path: Path) -> None:
    rel = Path(os.path.relpath(MANIFESTS, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"namespace: monitoring\ncomponents:\n  - {rel / 'components' / 'grafana-dashboards'}\n")
    [config] = kustomize(tmp_path)
    assert config["kind"] == "ConfigMap"
    assert config["metadata"]["name"] == "jobfence-grafana-dashboards"
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(config["data"]) == [p.name for p in DASHBOARDS]
    for name, text in config["data"].items():
        assert json.loads(text)["uid"] == load(OUT / name)["uid"]
