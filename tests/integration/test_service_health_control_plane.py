"""The gates of a run with everything real but the service and the exporters: the engine
drives a three-wave drain on the control plane, a real Prometheus (testenv/prometheus.py)
scrapes a stand-in dcgm-exporter per node (a real capture) and a stand-in service counting
its requests and errors; the pool's analysis query is the service's error ratio, and each
node's DCGM signals are read through the same Prometheus before and after its change.
A clean run passes every gate; an error ratio the test raises during the second wave
halts the run after that wave, its query and value in the thread, the third wave never
started; an XID 79 a node raises after its reading before keeps it cordoned and halts
the run with the readings."""

from __future__ import annotations

import contextlib
import functools
import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from storage import audit
from storage.database import Database
from testenv import fleet as fl
from testenv.controlplane import free_port
from testenv.install import wait_until
from testenv.prometheus import prometheus_binary
from testenv.summary import advertised
from tests.dcgm_pages import T4, T4_HOST, QuietHandler
from tests.integration import engine_harness as h
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService
from workflows.prometheus.client import Endpoint, PrometheusUnavailable, instant_query
from workflows.requests.service import RequestService

NODES = ("health-01", "health-02", "health-03")
ERROR_RATIO = ('sum(rate(checkout_requests_total{code="500"}[5s])) / sum(rate(checkout_requests_total[5s]))')


class StandInService:
    """A service's `/metrics`: every scrape it served 100 more requests, `ratio` of them
    failed (a counter pair, as a real service exports them)."""

    def __init__(self) -> None:
        self.ratio = 0.0
        self.total = 0
        self.errors = 0
        self._lock = threading.Lock()
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                with service._lock:
                    service.total += 100
                    service.errors += round(100 * service.ratio)
                    ok, failed = service.total - service.errors, service.errors
                body = ("# TYPE checkout_requests_total counter\n"
                        f'checkout_requests_total{{code="200"}} {ok}\n'
                        f'checkout_requests_total{{code="500"}} {failed}\n').encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"


def page(node: str, *, xid: int = 0) -> str:
    """The node's stand-in exporter page: the real T4 capture, named for it, its last XID `xid`."""
    text = T4.replace(T4_HOST, f'Hostname="{node}"')
    if xid:
        marker = 'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 0\n'
        first = text.index("DCGM_FI_DEV_XID_ERRORS{")
        end = text.index(marker, first) + len(marker)
        text = text[:end - 2] + f"{xid}\n" + text[end:]
    return text


@contextlib.contextmanager
def prometheus(tmp_path: Path, service: StandInService) -> Iterator[str]:
    """A real Prometheus scraping, every second, the service and each node's stand-in
    dcgm-exporter page (a real capture, named for the node)."""
    served = tmp_path / "exporters"
    served.mkdir()
    for node in NODES:
        (served / f"{node}.txt").write_text(page(node))
    exporters = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(served)))
    threading.Thread(target=exporters.serve_forever, daemon=True).start()
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "checkout", "static_configs": [{"targets": [service.target]}]},
        *({"job_name": f"dcgm-{node}", "metrics_path": f"/{node}.txt",
           "static_configs": [{"targets": [f"127.0.0.1:{exporters.server_address[1]}"]}]} for node in NODES)]}))
    process = subprocess.Popen([str(prometheus_binary()), f"--config.file={config}",
                                f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{web}"

    def reads_the_ratio() -> bool:
        try:
            return len(instant_query(Endpoint(url=url), "up == 1")) == 1 + len(NODES) and bool(
                instant_query(Endpoint(url=url), ERROR_RATIO))
        except PrometheusUnavailable:
            return False  # still starting

    try:
        wait_until(reads_the_ratio, timeout=90, what="Prometheus to scrape the service and every stand-in exporter")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        exporters.shutdown()
        service.server.shutdown()


def gated_config(url: str) -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "signals": {"prometheus": {"url": url}},
        "pools": {"health": {"kind": "training", "approvals": h.NO_APPROVALS, "windows": "always",
                             "max_unavailable": 1,
                             "analysis": [{"name": "checkout-errors", "query": ERROR_RATIO, "max": 0.05,
                                           "for": "4s"}]}},
        "access": {"users": {"U0ALICE": ["operator"]}, "names": {"U0ALICE": "alice"}},
    })


def start(db: Database, config: GpuopsConfig):
    the_plan = h.plan("drain", "health", [[n] for n in NODES])
    alice = config.actor("U0ALICE")
    request = RequestService(db, config).submit(alice, kind="drain", pool="health", targets=list(NODES),
                                                plan=the_plan, window_start=None, window_end=None,
                                                reason="service health test", channel=h.CHANNEL, now=h.now())
    return RunService(db).start(request.id, dry_run=False, now=h.now(), actor=alice)


@pytest.fixture
def health_fleet(fleet, cluster):
    fleet(fl.FleetSpec(name="health", system_nodes=0, pools=(fl.PoolSpec(name="health", nodes=len(NODES)),)))
    installer = cluster.installer()
    wait_until(lambda: all(advertised(h.node(installer, n)) == 8 for n in NODES), timeout=60,
               what="the nodes to advertise their GPUs")
    return installer


def test_a_clean_run_passes_every_gate_between_its_waves(health_fleet, cluster, db, tmp_path):
    service = StandInService()
    with prometheus(tmp_path, service) as url:
        config = gated_config(url)
        run = start(db, config)
        assert config.signals is not None
        with h.EngineThread(cluster.kubeconfig, db.path, pools=config.pools, health=config.signals.health_queries(),
                            signals=config.signals.service()):
            finished = h.wait_run(db, run.id, timeout=120)

    assert finished.state == "succeeded", finished.halted_reason
    assert [e.target for e in audit.for_run(db, run.id) if e.action == "node.signals.after"] == list(NODES)
    posted = h.thread_messages(db)
    held = [m["text"] for m in posted if m["event"] == "run.health.held"]
    assert len(held) == 2 and all("checkout-errors 0" in text for text in held), held
    watched = [m["text"] for m in posted if m["event"] == "run.health"]
    assert [t.split(":")[0] for t in watched] == ["Wave 1 of 3 done", "Wave 2 of 3 done"]


def test_an_error_ratio_raised_during_a_wave_halts_the_run_after_that_wave_with_the_query_and_value(
        health_fleet, cluster, db, tmp_path):
    service = StandInService()
    with prometheus(tmp_path, service) as url:
        config = gated_config(url)
        run = start(db, config)
        assert config.signals is not None
        with h.EngineThread(cluster.kubeconfig, db.path, pools=config.pools, health=config.signals.health_queries(),
                            signals=config.signals.service()):
            h.wait_run(db, run.id, states=("running",))
            wait_until(lambda: RunService(db).get(run.id).run.current_wave == 1, timeout=60, what="the second wave")
            service.ratio = 0.5  # half the checkout requests fail from here on
            finished = h.wait_run(db, run.id, timeout=120)

    assert finished.state == "failed"
    reason = finished.halted_reason or ""
    assert "Service health failed after wave 2: checkout-errors read 0." in reason, reason
    assert "above its max 0.05" in reason and ERROR_RATIO in reason
    (halt,) = [m for m in h.thread_messages(db) if m["event"] == "run.failed"]
    assert ERROR_RATIO in halt["text"] and "checkout-errors read 0." in halt["text"]
    steps = {(s.node, s.kind): s.state for s in RunService(db).get(run.id).steps}
    assert steps[("health-02", "uncordon")] == "done"  # the wave in which it rose finished
    assert steps[("health-03", "cordon")] == "skipped"  # the next never started
    assert not h.unschedulable(health_fleet, "health-03")


class XidAfterReading:
    """The engine's real reader (through Prometheus), except that once `node`'s reading
    before is taken, its exporter's page starts showing XID 79 and the reading waits until
    Prometheus has scraped it: the GPU falls off the bus during the node's change."""

    def __init__(self, reader, served: Path, url: str, node: str) -> None:
        self.reader, self.served, self.url, self.node = reader, served, url, node
        self.raised = False

    def read(self, node: str | None = None):
        reading = self.reader.read(node)
        if node == self.node and not self.raised:
            self.raised = True
            (self.served / f"{node}.txt").write_text(page(node, xid=79))
            wait_until(lambda: [s.value for s in instant_query(Endpoint(url=self.url),
                                                                f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}"}}')] == [79.0],
                       timeout=30, what="Prometheus to scrape the XID")
        return reading


def test_an_xid_79_raised_during_a_nodes_change_keeps_it_cordoned_and_halts_the_run_with_the_readings(
        health_fleet, cluster, db, tmp_path):
    service = StandInService()
    with prometheus(tmp_path, service) as url:
        config = gated_config(url)
        run = start(db, config)
        assert config.signals is not None
        signals = XidAfterReading(config.signals.service(), tmp_path / "exporters", url, "health-02")
        with h.EngineThread(cluster.kubeconfig, db.path, pools=config.pools, health=config.signals.health_queries(),
                            signals=signals):
            finished = h.wait_run(db, run.id, timeout=120)

    assert finished.state == "failed"
    reason = finished.halted_reason or ""
    assert "health-02: new GPU faults after its change: GPU 0 raised XID 79 (GPU has fallen off the bus" in reason
    assert "Before: GPU 0: last XID 0" in reason and "After: GPU 0: last XID 79" in reason, reason
    (halt,) = [m for m in h.thread_messages(db) if m["event"] == "run.failed"]
    assert "XID 79" in halt["text"] and "Left cordoned by this run: health-02" in halt["text"]
    assert h.unschedulable(health_fleet, "health-02") and not h.unschedulable(health_fleet, "health-01")
    steps = {(s.node, s.kind): s.state for s in RunService(db).get(run.id).steps}
    assert steps[("health-02", "uncordon")] == "skipped" and steps[("health-03", "cordon")] == "skipped"
