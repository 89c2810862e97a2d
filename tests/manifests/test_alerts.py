"""The alert rules with the real `promtool` (Debian's `prometheus` package ships it):
`promtool check rules` on the rendered PrometheusRule's groups, and `promtool test rules`
on tests/fixtures/promtool/alerts_test.yml, which fires every alert on a series that should
fire it and keeps it silent on one that should not. Every alert links its runbook entry
with an absolute URL, under the one setting of the alerts component."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.manifests import REPO, RUNBOOK_URL, Obj, one, render_with

PROMTOOL = shutil.which("promtool")
TESTS = REPO / "tests" / "fixtures" / "promtool" / "alerts_test.yml"
RUNBOOK = REPO / "docs" / "RUNBOOK.md"

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                                    "(Debian's `prometheus`; .ci/run installs it)")


def alerts(objects: list[Obj]) -> list[Obj]:
    return [r for g in one(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]
            if "alert" in r]


def rules_file(objects: list[Obj], where: Path) -> Path:
    path = where / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": one(objects, "PrometheusRule")["spec"]["groups"]},
                                   sort_keys=False))
    return path


@needs_promtool
def test_promtool_checks_the_rendered_rules(with_alerts: list[Obj], tmp_path: Path) -> None:
    r = subprocess.run([str(PROMTOOL), "check", "rules", str(rules_file(with_alerts, tmp_path))],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_every_alert_fires_and_stays_silent_under_promtool(with_alerts: list[Obj],
                                                          tmp_path: Path) -> None:
    rules_file(with_alerts, tmp_path)
    shutil.copy2(TESTS, tmp_path / TESTS.name)
    r = subprocess.run([str(PROMTOOL), "test", "rules", TESTS.name], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    # Each alert has a case where it fires and one where it does not.
    cases = [c for t in yaml.safe_load(TESTS.read_text())["tests"]
             for c in t.get("alert_rule_test", [])]
    for rule in alerts(with_alerts):
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), rule["alert"]
        assert any(not c["exp_alerts"] for c in mine), rule["alert"]


def test_every_alert_links_its_runbook_entry(with_alerts: list[Obj]) -> None:
    text = RUNBOOK.read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^## (.+)$", text, re.MULTILINE)}
    for rule in alerts(with_alerts):
        url = rule["annotations"]["runbook_url"]
        assert url == f"{RUNBOOK_URL}#{rule['alert'].lower()}", rule["alert"]
        assert url.split("#")[1] in anchors, rule["alert"]
        entry = text.split(f"## {rule['alert']}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Means**", "**Investigate**", "**Resolve**"):
            assert part in entry, (rule["alert"], part)
        assert "jobfence " in entry, rule["alert"]  # the exact commands to run


def test_the_runbook_links_follow_their_one_setting() -> None:
    """Alertmanager opens what the alert says: an absolute URL, all of them from the
    annotation jobfence.io/runbook (what `make deploy RUNBOOK_URL=...` sets)."""
    page = "https://git.example/ops/jobfence/blob/v0.1.0/docs/RUNBOOK.md"
    rendered = render_with("alerts", runbook_url=page)
    rule = one(rendered, "PrometheusRule")
    assert rule["metadata"]["annotations"]["jobfence.io/runbook"] == page
    for alert in alerts(rendered):
        assert alert["annotations"]["runbook_url"] == f"{page}#{alert['alert'].lower()}"
