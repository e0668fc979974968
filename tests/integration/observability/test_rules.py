"""The alert rules pass promtool (check + one unit test per alert), ship identically as a
PrometheusRule manifest, and the Grafana dashboards are well-formed (docs/observability.md).
Whether every metric they name exists is checked against a live fleet in test_prometheus."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.observability.test_prometheus import prometheus_binary

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "infra" / "prometheus"
DASHBOARDS = sorted((REPO / "infra" / "grafana").glob("*.json"))


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    prometheus_binary()  # Debian's package brings promtool with it
    tool = shutil.which("promtool")
    assert tool, "promtool comes with Debian's prometheus package"
    return subprocess.run([tool, *args], cwd=RULES, capture_output=True, text=True, check=False)


def test_the_rules_are_valid_and_every_alert_has_a_passing_unit_test() -> None:
    checked = promtool("check", "rules", "rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "rules_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {
        r["alert"]
        for g in yaml.safe_load((RULES / "rules.yml").read_text())["groups"]
        for r in g["rules"]
    }
    cases = yaml.safe_load((RULES / "rules_test.yml").read_text())["tests"]
    covered = {c["alertname"] for t in cases for c in t["alert_rule_test"] if c["exp_alerts"]}
    assert alerts == covered, f"alerts without a firing test case: {sorted(alerts - covered)}"


def test_the_prometheusrule_manifest_holds_the_same_rules() -> None:
    rules = yaml.safe_load((RULES / "rules.yml").read_text())
    manifest = yaml.safe_load((RULES / "prometheusrule.yaml").read_text())
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["spec"] == rules


def test_three_dashboards_each_panel_with_a_query() -> None:
    assert [p.name for p in DASHBOARDS] == [
        "control-plane.json",
        "deployment-inference.json",
        "fleet-capacity-cost.json",
    ]
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"].startswith("gpufleet-") and board["panels"], path.name
        for panel in board["panels"]:
            assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
