"""The chart's PrometheusRule and Grafana dashboard ConfigMap as a real helm renders them
(built by testenv): off by default; on, the rules are files/alerts.yaml filled in as
tests/unit/test_chart_alerts.py fills it for promtool, and the dashboard is
files/dashboard.json under the Grafana sidecar's label."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.packaging.test_helm_values_schema import CHART, template
from tests.unit.test_chart_alerts import render


def _objects(home: Path, *values: str) -> dict[str, dict]:
    done = template(home, *values)
    assert done.returncode == 0, done.stderr
    return {o["kind"]: o for o in yaml.safe_load_all(done.stdout) if o}


def test_the_alerts_and_the_dashboard_are_off_by_default(tmp_path):
    objects = _objects(tmp_path)
    assert "PrometheusRule" not in objects
    assert not [o for o in objects.values() if o["metadata"].get("labels", {}).get("grafana_dashboard")]


def test_on_the_rules_are_the_tested_file_with_runbook_links_and_the_dashboard_carries_the_sidecars_label(tmp_path):
    full = str(CHART / "ci" / "values-full.yaml")
    rule = _objects(tmp_path, "--values", full)["PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"] == yaml.safe_load(render(job="gpuops-metrics", approvals_waiting_seconds=7200,
                                                 docs_url="https://gpuops.example.com/docs/"))
    dashboards = [o for o in yaml.safe_load_all(template(tmp_path, "--values", full).stdout)
                  if o and o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    (dashboard,) = dashboards
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert json.loads(dashboard["data"]["gpuops.json"]) == json.loads((CHART / "files" / "dashboard.json").read_text())

    # The docs URL from the configuration; without one, no runbook links.
    rule = _objects(tmp_path, "--set", "metrics.prometheusRule.enabled=true",
                    "--set", "config.docs_url=https://docs.example")["PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(render(job="gpuops", approvals_waiting_seconds=14400,
                                                 docs_url="https://docs.example"))
    rule = _objects(tmp_path, "--set", "metrics.prometheusRule.enabled=true")["PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(render(job="gpuops", approvals_waiting_seconds=14400, docs_url=""))


def test_a_wrong_alert_threshold_is_refused_with_its_key(tmp_path):
    done = template(tmp_path, "--set", "metrics.prometheusRule.enabled=true",
                    "--set", "metrics.prometheusRule.approvalsWaitingSeconds=soon")
    assert done.returncode != 0 and "/metrics/prometheusRule/approvalsWaitingSeconds" in done.stderr
