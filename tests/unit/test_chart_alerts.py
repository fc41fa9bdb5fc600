"""The chart's alert rules (deploy/helm/gpuops/files/alerts.yaml, which
templates/prometheusrule.yaml puts in a PrometheusRule) under `promtool test rules`, from
the Debian package the metrics tests' Prometheus comes from: each alert on series that
fire it and series that do not (tests/unit/chart_alerts_cases.yaml), and each alert's
runbook link names a runbook page. The chart's own rendering of the file is compared with
`render` in tests/packaging/test_helm_monitoring.py (helm is built from Go there)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import yaml

from testenv.prometheus import promtool_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuops"
CASES = Path(__file__).with_name("chart_alerts_cases.yaml")
DOCS = "https://docs.example"


def render(*, job: str, approvals_waiting_seconds: int, docs_url: str) -> str:
    """The rules file as templates/prometheusrule.yaml fills it in."""
    text = (CHART / "files" / "alerts.yaml").read_text()
    text = text.replace("__JOB__", job).replace("__APPROVALS_WAITING_SECONDS__", str(approvals_waiting_seconds))
    if docs_url:
        return text.replace("__DOCS_URL__", docs_url.rstrip("/"))
    return "".join(line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("runbook_url:"))


def _defaults() -> str:
    rule = yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]["prometheusRule"]
    return render(job="gpuops", approvals_waiting_seconds=rule["approvalsWaitingSeconds"], docs_url=DOCS)


def _alerts(text: str) -> list[dict]:
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


def _cases() -> dict:
    """The cases, each expected alert's annotations completed with its rule's fixed ones
    (promtool compares every annotation; the cases spell out the summary)."""
    cases = yaml.safe_load(CASES.read_text())
    rules = {rule["alert"]: rule["annotations"] for rule in _alerts(_defaults())}
    for case in cases["tests"]:
        for test in case["alert_rule_test"]:
            for alert in test["exp_alerts"]:
                fixed = {k: v for k, v in rules[test["alertname"]].items() if "{{" not in v}
                alert["exp_annotations"] = {**fixed, **alert.get("exp_annotations", {})}
    return {"rule_files": ["alerts.yaml"], **cases}


def test_each_alert_fires_on_its_series_and_not_on_others(tmp_path):
    (tmp_path / "alerts.yaml").write_text(_defaults())
    cases = _cases()
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump(cases))
    check = subprocess.run([str(promtool_binary()), "check", "rules", "alerts.yaml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    done = subprocess.run([str(promtool_binary()), "test", "rules", "cases.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

    # Every alert has a case that fires it and a case where it stays quiet.
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in cases["tests"]:
        for test in case["alert_rule_test"]:
            (fired if test["exp_alerts"] else quiet).add(test["alertname"])
    names = {rule["alert"] for rule in _alerts(_defaults())}
    assert fired == names and quiet == names, (names - fired, names - quiet)


def test_a_broken_rule_fails_the_promtool_cases(tmp_path):
    (tmp_path / "alerts.yaml").write_text(_defaults().replace("gpuops_cluster_up{job=\"gpuops\"} == 0",
                                                              "gpuops_cluster_up{job=\"gpuops\"} == 1"))
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump(_cases()))
    done = subprocess.run([str(promtool_binary()), "test", "rules", "cases.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "GpuopsClusterUnreachable" in done.stdout + done.stderr


def test_each_alert_links_its_runbook_page_and_none_without_a_docs_url():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    pages = hooks.generated_pages()
    for rule in _alerts(_defaults()):
        url = rule["annotations"]["runbook_url"]
        assert url == f"{DOCS}/runbooks/alerts/{rule['alert']}/"
        page = pages[f"runbooks/alerts/{rule['alert']}.md"]
        for heading in ("## What it means", "## What to check first", "## Commands"):
            assert heading in page, rule["alert"]
    bare = render(job="gpuops", approvals_waiting_seconds=1, docs_url="")
    assert "__DOCS_URL__" not in bare and all("runbook_url" not in r["annotations"] for r in _alerts(bare))
