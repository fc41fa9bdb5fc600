"""The health port (/healthz, /readyz) and the metrics port (/metrics) on a runtime in this
process: what each answers, when readiness fails, and the probes answering while slow
clients take every connection. (`gpuops run` itself, scraped by a real Prometheus, is in
tests/integration/test_health_and_metrics_control_plane.py.)"""

from __future__ import annotations

import datetime as dt
import socket

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bot import cli
from bot.health import PROBE_SETTINGS, HealthServer, MetricsServer, Readiness
from bot.metrics import Metrics, Sources
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage.ids import RunId
from tests.drips import Drips
from testenv.controlplane import free_port
from tests.e2e.harness import http_get, submit_upgrade


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class _Cache:
    """A watch cache still listing, then synced."""

    synced = False


class _Listed:
    """The demo fleet as a watch cache that has listed it."""

    def __init__(self, source) -> None:
        self.fleet = source.fleet

    def states(self) -> list:
        return []


def test_each_path_answers_what_a_probe_or_a_scrape_expects(runtime):
    submit_upgrade(runtime)
    cache = _Cache()
    metrics = Metrics(Sources(database=runtime.database.get, leader=lambda: False))
    server = HealthServer(Readiness(database=runtime.database.get, cache=cache, leader=lambda: False),
                          host="127.0.0.1", port=0).start()
    scrapes = MetricsServer(metrics, host="127.0.0.1", port=0).start()
    try:
        assert http_get(server.base_url + "/healthz")[::2] == (200, "ok\n")
        status, _, body = http_get(server.base_url + "/readyz")
        assert (status, body) == (503, "database: open\nwatch cache: still listing the fleet\n"
                                       "engine: standby (another replica holds the Lease); answering Slack\n")
        cache.synced = True
        assert http_get(server.base_url + "/readyz")[0] == 200  # a standby is ready: it answers Slack
        metrics.observe_kube("GET", "200", 0.02)
        status, kind, body = http_get(scrapes.base_url + "/metrics")
        assert status == 200 and kind.startswith("text/plain; version=")
        samples = _samples(body)
        assert samples[("gpuops_requests", (("kind", "upgrade"), ("state", "pending")))] == 1
        assert samples[("gpuops_approvals_pending", ())] == 1
        assert samples[("gpuops_kube_api_requests_total", (("code", "200"), ("verb", "GET")))] == 1
        assert samples[("gpuops_engine_lease_held", ())] == 0
        assert samples[("gpuops_slack_outbox", (("state", "pending"),))] >= 0
        assert http_get(server.base_url + "/nothing")[0] == 404
        # Each port serves its own paths only: the health port is not for scrapes.
        assert http_get(server.base_url + "/metrics")[0] == 404
        assert http_get(scrapes.base_url + "/healthz")[0] == 404
    finally:
        server.stop()
        scrapes.stop()


def test_a_database_that_cannot_answer_is_not_ready(runtime, tmp_path):
    def broken():
        raise OSError("disk I/O error")

    server = HealthServer(Readiness(database=broken), host="127.0.0.1", port=0).start()
    try:
        assert http_get(server.base_url + "/readyz")[::2] == (503, "database: OSError: disk I/O error\n")
        assert http_get(server.base_url + "/healthz")[0] == 200  # alive all the same: no restart would help
    finally:
        server.stop()


def test_probes_answer_while_more_slow_clients_than_the_health_port_takes_drip_at_it(runtime):
    server = HealthServer(Readiness(database=runtime.database.get), host="127.0.0.1", port=0).start()
    address = ("127.0.0.1", int(server.base_url.rsplit(":", 1)[1]))
    drips = Drips(address, count=PROBE_SETTINGS.max_connections + 5, every=0.5, seconds=60)
    drips.start()
    try:
        answers = [http_get(server.base_url + path)[0] for _ in range(5) for path in ("/healthz", "/readyz")]
        assert answers == [200] * 10
    finally:
        drips.stop()
        server.stop()


def test_a_taken_metrics_port_stops_the_start_with_the_flag_to_change_and_frees_the_health_port(runtime):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        health_port = free_port()
        with pytest.raises(cli._PortUnavailable) as refused:
            cli._serve_health(runtime, Metrics(), health_port=health_port, metrics_port=port)
    assert str(refused.value).startswith(f"cannot serve /metrics on port {port} (")
    assert str(refused.value).endswith("): free it or pass --metrics-port")
    with socket.socket() as again:  # the health port it had opened is closed again
        again.bind(("0.0.0.0", health_port))


def test_a_scrape_tells_capacity_per_pool_how_long_approvals_wait_and_each_runs_window_and_halt(runtime, fleet_source):
    asked = dt.datetime(2026, 3, 2, 8, 0, tzinfo=dt.timezone.utc)
    now = asked + dt.timedelta(hours=2)
    submit_upgrade(runtime, now=asked)  # waits for approvals
    db = runtime.database.get()
    late = stored_requests.create(db, kind="drain", pool="training-a", targets=["training-a-001"],
                                  window_start=asked, window_end=asked + dt.timedelta(hours=1), reason="r",
                                  requester="U0ALICE", requester_name="alice", plan={}, plan_hash="h",
                                  approvals_required=0, expires_at=now + dt.timedelta(days=1), at=asked)
    on_time = stored_requests.create(db, kind="drain", pool="serving-a", targets=["serving-a-000"],
                                     window_start=asked, window_end=now + dt.timedelta(hours=1), reason="r",
                                     requester="U0ALICE", requester_name="alice", plan={}, plan_hash="h",
                                     approvals_required=0, expires_at=now + dt.timedelta(days=1), at=asked)
    halted = stored_requests.create(db, kind="drain", pool="serving-a", targets=["serving-a-003"],
                                    window_start=None, window_end=None, reason="r", requester="U0ALICE",
                                    requester_name="alice", plan={}, plan_hash="h", approvals_required=0,
                                    expires_at=now + dt.timedelta(days=1), at=asked)
    for request, run in ((late, "r-late"), (on_time, "r-on-time"), (halted, "r-halted")):
        stored_runs.create(db, request_id=request.id, dry_run=False, at=asked, id=RunId(run))
        stored_runs.transition(db, id=RunId(run), expected="pending", new="running", at=asked)
    stored_runs.transition(db, id=RunId("r-halted"), expected="running", new="failed",
                           at=now - dt.timedelta(minutes=30), halted_reason="the driver step failed")

    metrics = Metrics(Sources(database=runtime.database.get, fleet=_Listed(fleet_source), clock=lambda: now))
    samples = _samples(generate_latest(metrics.registry).decode())

    assert samples[("gpuops_approvals_oldest_pending_seconds", ())] == 7200
    labels = (("kind", "drain"), ("pool", "training-a"), ("run", "r-late"))
    assert samples[("gpuops_run_window_end_timestamp_seconds", labels)] == (asked + dt.timedelta(hours=1)).timestamp()
    assert samples[("gpuops_run_overran", labels)] == 1
    assert samples[("gpuops_run_overran", (("kind", "drain"), ("pool", "serving-a"), ("run", "r-on-time")))] == 0
    assert samples[("gpuops_run_halted_seconds", (("kind", "drain"), ("pool", "serving-a"), ("run", "r-halted")))] \
        == 1800
    assert not [k for k in samples if k[0] == "gpuops_run_overran" and ("run", "r-halted") in k[1]]
    # Every run state and every severity has a series, 0 when none: an alert or a panel finds it.
    assert samples[("gpuops_runs", (("state", "aborted"),))] == 0
    assert samples[("gpuops_runs", (("state", "running"),))] == 2
    assert samples[("gpuops_findings", (("severity", "critical"),))] == 0
    assert samples[("gpuops_steps_in_flight", (("kind", "cordon"),))] == 0
    # The demo fleet: three serving-a nodes of 8 GPUs (the first with half of them unhealthy).
    assert samples[("gpuops_pool_gpus", (("pool", "serving-a"), ("state", "physical")))] == 24
    assert samples[("gpuops_pool_gpus", (("pool", "serving-a"), ("state", "advertised")))] == 24
    assert samples[("gpuops_pool_gpus_out", (("by", "hand"), ("pool", "serving-a")))] == 0

