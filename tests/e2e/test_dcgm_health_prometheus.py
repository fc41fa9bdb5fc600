"""GPU health read from a real Prometheus: it scrapes a local stand-in for five nodes'
dcgm-exporters, each serving a real capture from ../shared/reference/dcgm-exporter (two
unchanged, three changed to carry an XID 79, a double-bit ECC error and a failed row
remap: `tests.dcgm_pages`), and gpuops reads it through its own reader, as `/gpu node` and
`/gpu findings` do. No control plane: the fleet is plain node values."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import http.server
import json
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
import yaml

from bot.render_blocks import render_blocks
from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from testenv.install import wait_until
from testenv.prometheus import prometheus_binary
from tests.dcgm_pages import DBE, HEALTHY, NODES, REMAP, VGPU_NODE, XID79, QuietHandler, pages
from tests.e2e.harness import StaticFleet, build_demo_fleet, demo_config, now
from workflows.config import GpuopsConfig
from workflows.prometheus.client import Endpoint, PrometheusUnavailable, instant_query


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus scraping one stand-in exporter page per node every second."""
    with _prometheus(tmp_path_factory.mktemp("dcgm"), {None: NODES}) as url:
        yield url


@contextlib.contextmanager
def _prometheus(tmp_path, clusters: dict[str | None, tuple[str, ...]]) -> Iterator[str]:
    """A real Prometheus scraping stand-in exporter pages every second: per cluster (its
    series labelled `cluster=<name>`, as one Prometheus or Thanos over several clusters
    labels them; None: no label) the pages of its nodes."""
    served = tmp_path / "exporters"
    served.mkdir()
    for node, text in pages().items():
        (served / f"{node}.txt").write_text(text)  # .txt: served as text/plain, the exposition format
    exporters = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(served)))
    threading.Thread(target=exporters.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{exporters.server_address[1]}"
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler) as probe:
        web = probe.server_address[1]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": f"dcgm-{cluster or 'all'}-{node}", "metrics_path": f"/{node}.txt",
         "static_configs": [{"targets": [target], **({"labels": {"cluster": cluster}} if cluster else {})}]}
        for cluster, nodes in clusters.items() for node in nodes]}))
    jobs = sum(len(nodes) for nodes in clusters.values())
    process = subprocess.Popen([str(prometheus_binary()), f"--config.file={config}",
                                f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{web}"

    def scraped() -> bool:
        try:
            return len(instant_query(Endpoint(url=url), "up == 1")) == jobs
        except PrometheusUnavailable:
            return False  # still starting

    try:
        wait_until(scraped, timeout=60, what="Prometheus to scrape every stand-in exporter")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        exporters.shutdown()
        exporters.server_close()


def _config(url: str) -> GpuopsConfig:
    return demo_config(signals={"prometheus": {"url": url}})


def test_findings_from_a_real_prometheus_name_the_xid_79_the_double_bit_error_and_the_failed_row_remap(prometheus):
    config = _config(prometheus)
    signals = config.signals.service()  # type: ignore[union-attr]
    reading = signals.read()
    assert reading.unavailable is None and sorted(reading.nodes) == sorted(NODES)
    findings = signals.findings(reading, pools={node: node.rsplit("-", 1)[0] for node in NODES})
    by_node = {(f.subject, f.code, f.severity) for f in findings}
    assert by_node == {(XID79, "gpu-xid", "critical"), (DBE, "gpu-ecc-uncorrectable", "critical"),
                       (REMAP, "gpu-row-remap-failed", "critical")}
    (xid,) = [f for f in findings if f.code == "gpu-xid"]
    assert xid.pool == "training-a"
    assert xid.message.startswith(f"XID 79 on {XID79}, GPU 0 (GPU-f809e614-a528-4083-acbf-334600000000): GPU has "
                                  "fallen off the bus (PCIe)")
    (dbe,) = [f for f in findings if f.code == "gpu-ecc-uncorrectable"]
    assert "(GPU 0 (GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e): 2)" in dbe.message

    # One node's query returns that node's GPUs only; PCIe replays, a counter, arrive as written.
    one = signals.read(HEALTHY)
    assert list(one.nodes) == [HEALTHY]
    (gpu,) = one.nodes[HEALTHY].gpus  # type: ignore[index]
    assert (gpu.gpu_temp_c, gpu.pcie_replays, gpu.ecc_dbe) == (25, 0, None)


def test_the_rates_of_correctable_errors_and_replays_are_prometheus_increase_over_the_last_hour(prometheus):
    signals = _config(prometheus).signals.service()  # type: ignore[union-attr]

    def rates() -> dict:
        """Per node whose GPU counts replays, that count's rate (the vGPU capture sends none)."""
        return {name: g.pcie_replays_rate for name, h in signals.read().nodes.items() for g in h.gpus
                if g.pcie_replays is not None}

    # increase() needs two scrapes of a series; every node's rates come in the one query.
    wait_until(lambda: all(r is not None for r in rates().values()), timeout=30, what="two scrapes of each counter")
    counted = rates()
    assert sorted(counted) == sorted(n for n in NODES if n not in (XID79, VGPU_NODE))
    assert all(rate is not None and rate.per_hour == 0 for rate in counted.values()), counted
    (gpu,) = signals.read(DBE).nodes[DBE].gpus  # type: ignore[index]
    assert (gpu.ecc_sbe, gpu.ecc_sbe_rate.per_hour, gpu.ecc_sbe_rate.over) == (7, 0, dt.timedelta(hours=1))  # type: ignore[union-attr]
    assert (gpu.pcie_replays, gpu.pcie_replays_rate.per_hour) == (0, 0)  # type: ignore[union-attr]


def test_the_node_view_shows_each_gpus_health_and_its_findings(prometheus, tmp_path):
    config = _config(prometheus)
    fleet = build_demo_fleet(nodes=len(NODES), unhealthy=0, config=config)
    assert sorted(fleet.nodes) == sorted(NODES)
    services = Services.on_database(config=config, fleet=StaticFleet(fleet), database=open_database(tmp_path / "db"))
    try:
        reply = dispatch(f"node {REMAP}", actor=config.actor("U0DAVE"), services=services, now=now())
        findings = dispatch("findings", actor=config.actor("U0DAVE"), services=services, now=now())
    finally:
        services.database.close()  # type: ignore[union-attr]
    (health,) = [s for s in reply.sections if s.title == f"GPU health (DCGM, from Prometheus at {prometheus})"]
    assert health.table is not None
    (row,) = health.table.rows
    cells = dict(zip(health.table.columns, row))
    assert cells["GPU"] == "0 Tesla T4" and cells["last XID"] == "none" and cells["GPU temp"] == "25 °C"
    assert cells["memory temp"] == "not reported" and cells["clocks held by"] == "not reported"
    assert cells["row remap"] == "FAILED, 5 rows remapped (uncorrectable)"
    assert cells["ECC DBE/SBE"] == "not reported (ECC off or not collected)"
    assert [n.text for n in health.notices] == [
        f"DCGM reports 1 GPU of the 8 GFD counts on {REMAP}: the others' health is unknown (a GPU that fell off "
        "the bus drops out of DCGM; check `nvidia-smi` on the node)."]
    notices = [n for s in reply.sections for n in s.notices]
    assert any(n.severity == "critical" and n.text.startswith(f"Row remapping failed on {REMAP}") for n in notices)
    codes = {(n.subject, n.severity) for s in findings.sections for n in s.notices if "XID 79" in n.text}
    assert codes == {(XID79, "critical")}
    # What Slack and the console show (Block Kit's limits are checked by slack_sdk's models).
    assert "FAILED, 5 rows remapped (uncorrectable)" in json.dumps(render_blocks(reply).blocks, ensure_ascii=False)
    assert "GPU has fallen off the bus" in render_text(findings)


def test_prometheus_refusing_a_query_is_said_in_words(prometheus):
    with pytest.raises(PrometheusUnavailable, match="refused the query|HTTP 400"):
        instant_query(Endpoint(url=prometheus), "{")
    query = urllib.parse.urlencode({"query": "up"})
    assert json.loads(urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}").read())["status"] == "success"


def test_each_cluster_reads_its_own_series_from_one_prometheus_over_several(tmp_path):
    """One Prometheus (or Thanos) holding two clusters' series, told apart by a `cluster`
    label: each cluster's `signals.matchers` picks its own, so east's XID 79, double-bit
    error and failed remap are not west's, though west's nodes carry the same names."""
    west_nodes = (HEALTHY, VGPU_NODE)
    with _prometheus(tmp_path, {"east": NODES, "west": west_nodes}) as url:
        def signals(cluster: str) -> dict:
            return {"prometheus": {"url": url}, "matchers": {"cluster": cluster}}

        config = GpuopsConfig.model_validate({
            "clusters": {"east": {"home": True, "signals": signals("east")},
                         "west": {"kubeconfig": "/k", "signals": signals("west")}},
            "signals": {"prometheus": {"url": "http://unused.example:9090"}}})  # east's own wins
        east, west = (config.for_cluster(name).signals.service() for name in ("east", "west"))  # type: ignore[union-attr]
        pools = {node: "pool" for node in NODES}

        east_reading, west_reading = east.read(), west.read()
        assert sorted(east_reading.nodes) == sorted(NODES) and sorted(west_reading.nodes) == sorted(west_nodes)
        assert {f.subject for f in east.findings(east_reading, pools=pools)} == {XID79, DBE, REMAP}
        assert west.findings(west_reading, pools=pools) == ()
        assert list(west.read(HEALTHY).nodes) == [HEALTHY]


def test_another_cluster_cannot_read_its_exporters_directly():
    with pytest.raises(ValueError, match="signals.exporters is for the home cluster"):
        GpuopsConfig.model_validate({"clusters": {
            "east": {"home": True}, "west": {"kubeconfig": "/k", "signals": {"exporters": {}}}}})
    with pytest.raises(ValueError, match="'cluster-name' is not a Prometheus label name"):
        GpuopsConfig.model_validate({"signals": {"prometheus": {"url": "http://p.example:9090"},
                                                 "matchers": {"cluster-name": "west"}}})
    without = GpuopsConfig.model_validate({"clusters": {"east": {"home": True}, "west": {"kubeconfig": "/k"}},
                                           "signals": {"prometheus": {"url": "http://p.example:9090"}}})
    assert without.for_cluster("east").signals is not None and without.for_cluster("west").signals is None
