"""The health port (/healthz, /readyz) and the metrics port (/metrics). First on a runtime
in this process (what each answers, when readiness fails, and the probes answering while
slow clients take every connection), then `gpuops run` itself, a real process in Socket
Mode against the local control plane, scraped by a real Prometheus and queried through
Prometheus's HTTP API; its JSON log lines carry no token."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bot import cli
from bot.health import PROBE_SETTINGS, HealthServer, MetricsServer, Readiness
from bot.metrics import Metrics, Sources
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.prometheus import prometheus_binary
from tests.drips import Drips
from tests.e2e.conftest import ROOT, submit_upgrade


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class _Cache:
    """A watch cache still listing, then synced."""

    synced = False


def test_each_path_answers_what_a_probe_or_a_scrape_expects(runtime):
    submit_upgrade(runtime)
    cache = _Cache()
    metrics = Metrics(Sources(database=runtime.database.get, leader=lambda: False))
    server = HealthServer(Readiness(database=runtime.database.get, cache=cache, leader=lambda: False),
                          host="127.0.0.1", port=0).start()
    scrapes = MetricsServer(metrics, host="127.0.0.1", port=0).start()
    try:
        assert _get(server.base_url + "/healthz")[::2] == (200, "ok\n")
        status, _, body = _get(server.base_url + "/readyz")
        assert (status, body) == (503, "database: open\nwatch cache: still listing the fleet\n"
                                       "engine: standby (another replica holds the Lease); answering Slack\n")
        cache.synced = True
        assert _get(server.base_url + "/readyz")[0] == 200  # a standby is ready: it answers Slack
        metrics.observe_kube("GET", "200", 0.02)
        status, kind, body = _get(scrapes.base_url + "/metrics")
        assert status == 200 and kind.startswith("text/plain; version=")
        samples = _samples(body)
        assert samples[("gpuops_requests", (("kind", "upgrade"), ("state", "pending")))] == 1
        assert samples[("gpuops_approvals_pending", ())] == 1
        assert samples[("gpuops_kube_api_requests_total", (("code", "200"), ("verb", "GET")))] == 1
        assert samples[("gpuops_engine_lease_held", ())] == 0
        assert samples[("gpuops_slack_outbox", (("state", "pending"),))] >= 0
        assert _get(server.base_url + "/nothing")[0] == 404
        # Each port serves its own paths only: the health port is not for scrapes.
        assert _get(server.base_url + "/metrics")[0] == 404
        assert _get(scrapes.base_url + "/healthz")[0] == 404
    finally:
        server.stop()
        scrapes.stop()


def test_a_database_that_cannot_answer_is_not_ready(runtime, tmp_path):
    def broken():
        raise OSError("disk I/O error")

    server = HealthServer(Readiness(database=broken), host="127.0.0.1", port=0).start()
    try:
        assert _get(server.base_url + "/readyz")[::2] == (503, "database: OSError: disk I/O error\n")
        assert _get(server.base_url + "/healthz")[0] == 200  # alive all the same: no restart would help
    finally:
        server.stop()


def test_probes_answer_while_more_slow_clients_than_the_health_port_takes_drip_at_it(runtime):
    server = HealthServer(Readiness(database=runtime.database.get), host="127.0.0.1", port=0).start()
    address = ("127.0.0.1", int(server.base_url.rsplit(":", 1)[1]))
    drips = Drips(address, count=PROBE_SETTINGS.max_connections + 5, every=0.5, seconds=60)
    drips.start()
    try:
        answers = [_get(server.base_url + path)[0] for _ in range(5) for path in ("/healthz", "/readyz")]
        assert answers == [200] * 10
    finally:
        drips.stop()
        server.stop()


def test_a_taken_metrics_port_stops_the_start_with_the_flag_to_change_and_frees_the_health_port(runtime):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        health_port = _free_port()
        with pytest.raises(cli._PortUnavailable) as refused:
            cli._serve_health(runtime, Metrics(), health_port=health_port, metrics_port=port)
    assert str(refused.value).startswith(f"cannot serve /metrics on port {port} (")
    assert str(refused.value).endswith("): free it or pass --metrics-port")
    with socket.socket() as again:  # the health port it had opened is closed again
        again.bind(("0.0.0.0", health_port))


# ------------------------------------------------------------------ the real process


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.controlplane
def test_a_running_bot_is_scraped_by_prometheus_and_logs_json_lines_without_its_tokens(
        cluster, fleet, slack, fake_socket_mode, tmp_path):
    fleet(fl.FleetSpec(name="prom", system_nodes=0, pools=(fl.PoolSpec(name="prom", kind="training", nodes=2),)),
          simulate=False)
    health, scrapes, web = _free_port(), _free_port(), _free_port()
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
        assert "engine: this replica holds the Lease" in _get(f"http://127.0.0.1:{health}/readyz")[2]

        def query(promql: str) -> list[dict]:
            url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
            try:
                answer = json.loads(_get(url)[2])
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


def _ready(url: str) -> bool:
    try:
        return _get(url)[0] == 200
    except OSError:
        return False
