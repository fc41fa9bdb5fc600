"""GPU health read straight from the exporters, without Prometheus: five nodes' dcgm-exporter
pods, each a local stand-in on its own loopback address (127.0.0.N, one port for all, as
pods share the exporter's) serving a real capture (`tests.dcgm_pages`: two unchanged,
three with an XID 79, a double-bit ECC error and a failed row remap). The pages label
their GPUs with the pods' hostnames, not the nodes': the node is the pod's. gpuops finds
the pods and their IPs in the cluster snapshot, as the watch cache keeps it, and answers
`/gpu node` and `/gpu findings` as it does through Prometheus. No control plane."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from freezegun import freeze_time

from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from tests.dcgm_pages import DBE, HEALTHY, NODES, REMAP, XID79, StandInExporters, added, pages
from bot.wiring import runtime_from_fleet_source
from tests.e2e.harness import demo_config, demo_snapshot
from workflows.config import GpuopsConfig
from workflows.fleet.summary import Fleet, build_fleet
from workflows.kube.objects import ClusterSnapshot

T0 = dt.datetime(2026, 12, 4, 9, 0, tzinfo=dt.timezone.utc)
# The exporters name their GPUs' host as the pod's hostname (not the node's name).
HOSTNAMES = {node: f"nvidia-dcgm-exporter-{i:05x}" for i, node in enumerate(NODES)}


class ClusterSource:
    """What the watch cache gives: the fleet, and the snapshot it was assessed from."""

    def __init__(self, snapshot: ClusterSnapshot, config: GpuopsConfig) -> None:
        self.value = snapshot
        self.assessed = build_fleet(snapshot, settings=config.inventory_settings(), now=snapshot.taken_at)

    def fleet(self, now: dt.datetime) -> Fleet:
        return self.assessed

    def snapshot(self, now: dt.datetime) -> ClusterSnapshot:
        return self.value


@pytest.fixture
def exporters():
    with StandInExporters(pages(HOSTNAMES)) as stand_ins:
        yield stand_ins


@pytest.fixture
def config(exporters) -> GpuopsConfig:
    return demo_config(signals={"exporters": {"port": exporters.port, "timeout": "2s"}})


@pytest.fixture
def cluster(exporters, config) -> ClusterSource:
    return ClusterSource(demo_snapshot(nodes=len(NODES), unhealthy=0, exporter_ips=exporters.ips), config)


def _ask(command: str, *, config: GpuopsConfig, cluster: ClusterSource, tmp_path, signals=None):
    services = Services.on_database(config=config, fleet=cluster, database=open_database(tmp_path / "db"),
                                    signals=signals)
    try:
        return dispatch(command, actor=config.actor("U0DAVE"), services=services, now=T0)
    finally:
        services.database.close()  # type: ignore[union-attr]


def _notices(reply) -> list[str]:
    return [n.text for s in reply.sections for n in s.notices]


def test_findings_from_the_exporter_pods_name_the_xid_79_the_double_bit_error_and_the_failed_row_remap(
        config, cluster, exporters):
    signals = config.signals.service(cluster=cluster)  # type: ignore[union-attr]
    reading = signals.read()
    assert reading.source == f"dcgm-exporter pods (port {exporters.port})"
    assert reading.unavailable is None and reading.unknown == {} and sorted(reading.nodes) == sorted(NODES)
    findings = signals.findings(reading, pools={node: node.rsplit("-", 1)[0] for node in NODES})
    assert {(f.subject, f.code, f.severity) for f in findings} == {
        (XID79, "gpu-xid", "critical"), (DBE, "gpu-ecc-uncorrectable", "critical"),
        (REMAP, "gpu-row-remap-failed", "critical")}
    (xid,) = [f for f in findings if f.code == "gpu-xid"]
    assert xid.message.startswith(f"XID 79 on {XID79}, GPU 0 (GPU-f809e614-a528-4083-acbf-334600000000): GPU has "
                                  "fallen off the bus (PCIe)")
    # One node: that node's exporter only.
    asked_before = {node: len(exporters.asked(node)) for node in NODES}
    one = signals.read(HEALTHY)
    assert list(one.nodes) == [HEALTHY]
    assert {node: len(exporters.asked(node)) - asked_before[node] for node in NODES} == {
        node: int(node == HEALTHY) for node in NODES}
    (gpu,) = one.nodes[HEALTHY].gpus  # type: ignore[index]
    assert (gpu.gpu_temp_c, gpu.pcie_replays, gpu.ecc_dbe) == (25, 0, None)


def test_the_node_view_shows_the_pods_readings_and_the_replay_rate_from_the_second_reading_on(
        config, cluster, exporters, tmp_path):
    signals = config.signals.service(cluster=cluster)  # type: ignore[union-attr]
    title = f"GPU health (DCGM, from dcgm-exporter pods (port {exporters.port}))"
    with freeze_time(T0) as clock:
        first = _ask(f"node {REMAP}", config=config, cluster=cluster, tmp_path=tmp_path, signals=signals)
        (health,) = [s for s in first.sections if s.title == title]
        cells = dict(zip(health.table.columns, health.table.rows[0]))  # type: ignore[union-attr]
        assert cells["GPU"] == "0 Tesla T4" and cells["row remap"] == "FAILED, 5 rows remapped (uncorrectable)"
        assert cells["PCIe replays"] == "0 (rate not known yet)"
        assert any(text.startswith(f"Row remapping failed on {REMAP}") for text in _notices(first))

        # 120 replays in the next 30 minutes: 240 an hour, over the warning's 100.
        exporters.page(REMAP, re.sub(r"^(DCGM_FI_DEV_PCIE_REPLAY_COUNTER\{.*\}) 0$", r"\g<1> 120",
                                     pages(HOSTNAMES)[REMAP], flags=re.M))
        clock.move_to(T0 + dt.timedelta(minutes=30))
        second = _ask(f"node {REMAP}", config=config, cluster=cluster, tmp_path=tmp_path, signals=signals)
    (health,) = [s for s in second.sections if s.title == title]
    cells = dict(zip(health.table.columns, health.table.rows[0]))  # type: ignore[union-attr]
    assert cells["PCIe replays"] == "120 (240/h over 30m)"
    assert any(text.startswith(f"PCIe replays on {REMAP} at or over 100 an hour (GPU 0 (GPU-20c56d28-0da5-6d26-a36a-"
                               "e7af1ce2586e): 240/h over 30m, 120 since the driver loaded)")
               for text in _notices(second)), _notices(second)


def test_an_exporter_that_does_not_answer_leaves_its_node_unknown_with_the_reason(config, cluster, exporters,
                                                                                    tmp_path):
    exporters.stall(XID79)  # accepts, never answers: the 2 s timeout
    exporters.stop(DBE)  # refused
    exporters.page(REMAP, added(pages(HOSTNAMES)[HEALTHY], 'Hostname="x"', {}).replace("DCGM_FI_DEV", "OTHER"))
    port = exporters.port
    findings = _ask("findings", config=config, cluster=cluster, tmp_path=tmp_path)
    unknown = {n.subject: (n.severity, n.text) for s in findings.sections for n in s.notices
               if "unknown" in n.text}
    source = f"dcgm-exporter pods (port {port})"
    assert unknown == {
        XID79: ("warning", f"GPU health on {XID79} unknown: {source} on {XID79}: gpu-operator/nvidia-dcgm-exporter-"
                           f"{XID79} at {exporters.ips[XID79]}:{port} did not answer within 2 s. No DCGM finding can "
                           "be raised there until it is read."),
        DBE: ("warning", f"GPU health on {DBE} unknown: {source} on {DBE}: gpu-operator/nvidia-dcgm-exporter-{DBE} at "
                         f"{exporters.ips[DBE]}:{port} cannot be reached (Connection refused). No DCGM finding "
                         "can be raised there until it is read."),
        REMAP: ("warning", f"GPU health on {REMAP} unknown: {source} on {REMAP}: gpu-operator/nvidia-dcgm-exporter-"
                           f"{REMAP} at {exporters.ips[REMAP]}:{port} answered without any DCGM health series. No DCGM "
                           "finding can be raised there until it is read."),
    }
    texts = "\n".join(_notices(findings))
    assert "XID 79" not in texts and "double-bit" not in texts  # unknown, not healthy and not guessed
    node = _ask(f"node {DBE}", config=config, cluster=cluster, tmp_path=tmp_path)
    assert [t for t in _notices(node) if t.startswith("GPU health")] == [
        f"GPU health unknown: {source} on {DBE}: gpu-operator/nvidia-dcgm-exporter-{DBE} at {exporters.ips[DBE]}:{port} "
        "cannot be reached (Connection refused)."]


def test_the_bot_keeps_one_reader_so_a_rate_is_known_from_one_command_to_the_next(config, cluster, exporters,
                                                                                    tmp_path):
    runtime = runtime_from_fleet_source(config, cluster, tmp_path / "gpuops.db")

    def replays_cell() -> str:
        reply = dispatch(f"node {HEALTHY}", actor=config.actor("U0DAVE"), services=runtime.services(), now=T0)
        (health,) = [s for s in reply.sections if s.title and s.title.startswith("GPU health")]
        return dict(zip(health.table.columns, health.table.rows[0]))["PCIe replays"]  # type: ignore[union-attr]

    try:
        with freeze_time(T0) as clock:
            assert replays_cell() == "0 (rate not known yet)"
            clock.move_to(T0 + dt.timedelta(hours=1))
            assert replays_cell() == "0 (0/h over 1h)"
    finally:
        runtime.close()
