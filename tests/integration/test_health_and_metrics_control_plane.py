"""`gpuops run` itself, a real process in Socket Mode against the local control plane,
scraped by a real Prometheus and queried through Prometheus's HTTP API, every query of the
chart's Grafana dashboard among them; its JSON log lines carry no token. (The health and metrics ports on a runtime in this process are in
tests/e2e/test_health_and_metrics.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from testenv import fleet as fl
from testenv.install import wait_until
from testenv.prometheus import prometheus_binary
from testenv.controlplane import free_port
from tests.e2e.harness import ROOT, http_get


# ------------------------------------------------------------------ the real process




def test_a_running_bot_is_scraped_by_prometheus_and_logs_json_lines_without_its_tokens(
        cluster, fleet, slack, fake_socket_mode, tmp_path):
    fleet(fl.FleetSpec(name="prom", system_nodes=0, pools=(fl.PoolSpec(name="prom", kind="training", nodes=2),)),
          simulate=False)
    health, scrapes, web = free_port(), free_port(), free_port()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"pools": {"prom": {"kind": "training", "windows": "always"}}}))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLACK_")},
           "SLACK_BOT_TOKEN": slack.bot_token, "SLACK_APP_TOKEN": slack.app_token, "SLACK_API_URL": slack.base_url,
           "POD_NAMESPACE": "default", "POD_NAME": "gpuops-prom-test", "GPUOPS_LOG_FORMAT": "json"}
    log_path = tmp_path / "bot.log"
    with open(log_path, "w") as log:
        bot = subprocess.Popen([str(Path(sys.executable).with_name("gpuops")), "run", "--kubeconfig",
                                str(cluster.kubeconfig), "--context", "admin", "--config", str(config), "--database",
                                str(tmp_path / "gpuops.db"), "--health-port", str(health),
                                "--metrics-port", str(scrapes)],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    scrape = tmp_path / "prometheus.yml"
    scrape.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "gpuops", "static_configs": [{"targets": [f"127.0.0.1:{scrapes}"]}]}]}))
    prometheus = subprocess.Popen([str(prometheus_binary()), f"--config.file={scrape}",
                                   f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _ready(f"http://127.0.0.1:{health}/readyz"), timeout=60,
                   what=f"the bot to be ready (its log: {log_path})")
        assert "engine: this replica holds the Lease" in http_get(f"http://127.0.0.1:{health}/readyz")[2]

        def query(promql: str) -> list[dict]:
            url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
            try:
                answer = json.loads(http_get(url)[2])
            except (OSError, ValueError):
                return []  # Prometheus still starting
            return answer["data"]["result"] if answer.get("status") == "success" else []

        wait_until(lambda: query('up{job="gpuops"} == 1'), timeout=60, what="Prometheus to scrape the bot")
        listed = query('gpuops_kube_api_requests_total{verb="GET",code="200"}')
        assert listed and float(listed[0]["value"][1]) > 0, listed
        assert query('gpuops_kube_api_requests_total{verb="WATCH",code="200"}')
        (held,) = query('gpuops_engine_lease_held{job="gpuops"}')
        assert held["value"][1] == "1"
        synced = {r["metric"]["resource"]: r["value"][1] for r in query("gpuops_watch_cache_synced")}
        assert synced["nodes"] == "1" and synced["pods"] == "1"
        assert query('gpuops_slack_api_calls_total{method="auth.test",outcome="ok"}')
        (physical,) = query('gpuops_pool_gpus{pool="prom",state="physical"}')
        assert physical["value"][1] == "16"  # two nodes of 8
        # Every panel of the chart's dashboard shows series, its `cluster` variable at "All".
        for title, promql in dashboard_queries():
            wait_until(lambda promql=promql: query(promql), timeout=60, what=f"the dashboard's {title!r} to show series: {promql}")
    finally:
        prometheus.terminate()
        bot.terminate()
        bot.wait(timeout=30)
        prometheus.wait(timeout=30)

    lines = log_path.read_text().splitlines()
    assert lines and all(json.loads(line)["level"] for line in lines), lines[:5]
    text = "\n".join(lines)
    assert slack.bot_token not in text and slack.app_token not in text
    assert any(json.loads(line)["message"].startswith("health: http://") for line in lines)


def dashboard_queries() -> list[tuple[str, str]]:
    """Each query of deploy/helm/gpuops/files/dashboard.json as Grafana sends it with every
    cluster chosen (its `allValue`) and a rate interval a 1s scrape fills."""
    dashboard = json.loads((ROOT / "deploy" / "helm" / "gpuops" / "files" / "dashboard.json").read_text())
    (every,) = [v["allValue"] for v in dashboard["templating"]["list"] if v["name"] == "cluster"]
    return [(panel["title"], target["expr"].replace("$cluster", every).replace("$__rate_interval", "1m"))
            for panel in dashboard["panels"] for target in panel["targets"]]


def _ready(url: str) -> bool:
    try:
        return http_get(url)[0] == 200
    except OSError:
        return False
