"""DCGM health straight from the exporter pods, without Prometheus: the `signals.exporters`
configuration (exactly one source; secrets only from files and only over https), the pod
IP in the pod view, which pod is a node's exporter, how counter rates are measured between
readings (and are "not known yet" before a second one), and that an exporter that does not
answer leaves its node unknown with the reason, never healthy. Pages are the real captures
(`tests.dcgm_pages`), served by local stand-ins on 127.0.0.N."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

import pytest
from freezegun import freeze_time

from tests.dcgm_pages import T4_UUID, HEALTHY, REMAP, StandInExporters, pages
from workflows.config import ConfigError, GpuopsConfig, load_config
from workflows.kube.gateway.decoding import pod_from_json
from workflows.kube.objects import ClusterSnapshot, NodeName, NodeObject, PodObject
from workflows.signals import messages as health_msg
from workflows.signals.exporters import ExporterPages, ExporterSettings, exporter_pods
from workflows.signals.findings import Thresholds
from workflows.signals.health import PCIE_REPLAYS, Rate
from workflows.signals.rates import CounterMemory
from workflows.signals.service import SignalsService, rates_from, rates_query
from workflows.prometheus.samples import Sample

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
NS = "gpu-operator"


# --------------------------------------------------------------------------------------
# Configuration


@pytest.mark.parametrize(("yaml_text", "error"), [
    ("signals:\n  thresholds: {}\n", r"config.yaml:2:3: signals: give prometheus \(a Prometheus that scrapes the "
                                     r"exporters\) or exporters \(each node's dcgm-exporter pod read directly\), "
                                     r"exactly one"),
    ("signals:\n  prometheus: {url: 'http://p:9090'}\n  exporters: {}\n", "exactly one"),
    ("signals:\n  exporters: {}\n  node_label: node\n",
     "signals: node_label is for prometheus: read from the exporters, the node is the pod's"),
    ("signals:\n  exporters: {bearer_token_file: /var/run/token}\n",
     "signals.exporters: bearer_token_file needs scheme https"),
    ("signals:\n  exporters: {ca_file: /etc/ca.pem}\n", "signals.exporters: ca_file is for scheme https"),
    ("signals:\n  exporters: {path: metrics}\n", "signals.exporters.path: 'metrics' is not a path such as /metrics"),
    ("signals:\n  exporters: {port: 0}\n", "signals.exporters.port: Input should be greater than or equal to 1"),
    ("signals:\n  exporters: {timeout: 2m}\n", "signals.exporters.timeout: the timeout must be more than 0 and at most"),
    ("signals:\n  exporters: {scheme: ftp}\n", "signals.exporters.scheme: Input should be 'http' or 'https'"),
    ("signals:\n  exporters: {timeout: 10s, deadline: 5s}\n",
     "signals.exporters: the deadline must be at least the timeout and at most 2m"),
    ("signals:\n  exporters: {pod_labels: {}}\n", "signals.exporters.pod_labels"),
    ("signals:\n  exporters: {token: s3cret}\n", "signals.exporters.token: Extra inputs are not permitted"),
])
def test_a_bad_exporters_section_stops_with_the_key_and_the_reason(tmp_path, yaml_text, error):
    path = tmp_path / "config.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=error):
        load_config(path)


def test_the_exporters_default_to_the_operators_pods_on_port_9400():
    config = GpuopsConfig.model_validate({"signals": {"exporters": {}}})
    assert config.signals is not None and config.signals.exporters is not None
    settings = config.signals.exporters.settings()
    assert (settings.port, settings.path, settings.scheme, settings.timeout_seconds, settings.namespace,
            dict(settings.pod_labels)) == (9400, "/metrics", "http", 5.0, None, {"app": "nvidia-dcgm-exporter"})
    assert settings.endpoint("10.2.3.4").url == "http://10.2.3.4:9400/metrics"
    assert settings.endpoint("fd00::7").url == "http://[fd00::7]:9400/metrics"
    https = GpuopsConfig.model_validate({"signals": {"exporters": {
        "scheme": "https", "port": 9443, "bearer_token_file": "/t", "ca_file": "/ca", "timeout": "2s", "namespace": "monitoring", "pod_labels": {"app.kubernetes.io/name": "dcgm-exporter"}}}})
    assert https.signals.exporters.settings().endpoint("10.2.3.4").url == "https://10.2.3.4:9443/metrics"  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------
# The pod IP in the view, and which pod is a node's exporter


def _pod_json(ip: str | None) -> dict:
    status = {"phase": "Running"} | ({"podIP": ip} if ip else {})
    return {"metadata": {"name": "nvidia-dcgm-exporter-x7k2p", "namespace": NS, "labels": {"app": "nvidia-dcgm-exporter"},
                         "creationTimestamp": "2026-12-01T10:00:00Z"},
            "spec": {"nodeName": "gpu-a-01", "containers": [{"name": "exporter", "image": "dcgm-exporter:4"}]},
            "status": status}


def test_the_pod_view_keeps_the_pod_ip_and_a_changed_ip_is_a_changed_view():
    first, moved, none = pod_from_json(_pod_json("10.2.3.4")), pod_from_json(_pod_json("10.2.9.9")), pod_from_json(
        _pod_json(None))
    assert (first.ip, moved.ip, none.ip) == ("10.2.3.4", "10.2.9.9", None)
    assert first == pod_from_json(_pod_json("10.2.3.4")) and first != moved and first != none


def _pod(node: str, name: str, *, ip: str | None = "10.0.0.1", phase: str = "Running", deleting: bool = False,
         ns: str = NS, app: str = "nvidia-dcgm-exporter", created: int = 1) -> PodObject:
    return PodObject(namespace=ns, name=name, node_name=NodeName(node), labels={"app": app}, annotations={},
                     phase=phase, ready=phase == "Running", deleting=deleting, owners=(), containers=(),
                     init_containers=(), images=(), gpu_requests={},
                     created_at=dt.datetime(2026, 12, created, tzinfo=UTC), ip=ip)


def _gpu_node(name: str) -> NodeObject:
    labels = {"nvidia.com/gpu.present": "true"}
    if name == "gpu-opted-out":
        labels["nvidia.com/gpu.deploy.dcgm-exporter"] = "false"
    return NodeObject(name=NodeName(name), labels=labels, annotations={},
                      unschedulable=False, taints=(), ready=True, ready_changed_at=None, capacity={}, allocatable={},
                      created_at=T0)


def _snapshot(*pods: PodObject, nodes: tuple[str, ...] = ()) -> ClusterSnapshot:
    return ClusterSnapshot(nodes={NodeName(n): _gpu_node(n) for n in nodes}, pods=pods, operator_namespace=NS,
                           operator_deployment=None, operator_crds_installed=True, taken_at=T0)


def test_a_nodes_exporter_is_its_running_pod_in_the_namespace_with_the_label():
    snapshot = _snapshot(
        _pod("a", "old", deleting=True, created=3), _pod("a", "new", ip="10.0.0.2", created=2),
        _pod("b", "pending", ip=None, phase="Pending", created=4), _pod("b", "running", created=1),
        _pod("c", "elsewhere", ns="monitoring"), _pod("c", "device-plugin", app="nvidia-device-plugin-daemonset"))
    found = exporter_pods(snapshot, namespace=NS, labels={"app": "nvidia-dcgm-exporter"})
    assert {node: pod.name for node, pod in found.items()} == {"a": "new", "b": "running"}
    assert exporter_pods(snapshot, namespace="monitoring", labels={"app": "nvidia-dcgm-exporter"})["c"].name == \
        "elsewhere"


# --------------------------------------------------------------------------------------
# Rates between readings: literal times


KEY = ("gpu-a-01", T4_UUID, PCIE_REPLAYS)


def test_a_first_reading_has_no_rate_yet_and_a_second_one_gives_the_increase_per_hour():
    memory = CounterMemory()
    assert memory.observe(KEY, 40, at=T0) is None
    assert memory.observe(KEY, 40, at=T0 + dt.timedelta(hours=2)) == Rate(per_hour=0, over=dt.timedelta(hours=2))
    assert memory.observe(KEY, 70, at=T0 + dt.timedelta(hours=2, minutes=15)) == Rate(
        per_hour=120, over=dt.timedelta(minutes=15))
    # Another GPU (or node, or counter) has its own first reading.
    assert memory.observe(("gpu-a-01", "GPU-other", PCIE_REPLAYS), 70, at=T0 + dt.timedelta(hours=3)) is None


def test_readings_closer_than_five_minutes_keep_the_last_rate_and_the_baseline():
    memory = CounterMemory()
    assert memory.observe(KEY, 0, at=T0) is None
    assert memory.observe(KEY, 1, at=T0 + dt.timedelta(seconds=5)) is None  # not 720 an hour
    assert memory.observe(KEY, 10, at=T0 + dt.timedelta(minutes=10)) == Rate(per_hour=60,
                                                                               over=dt.timedelta(minutes=10))
    assert memory.observe(KEY, 500, at=T0 + dt.timedelta(minutes=11)) == Rate(per_hour=60,
                                                                                over=dt.timedelta(minutes=10))
    # The baseline stayed at minute 10: 490 more in 10 minutes.
    rate = memory.observe(KEY, 500, at=T0 + dt.timedelta(minutes=20))
    assert rate == Rate(per_hour=2940, over=dt.timedelta(minutes=10))
    assert health_msg.rate_text(rate) == "2940/h over 10m" and health_msg.rate_text(None) == "rate not known yet"
    assert health_msg.rate_text(Rate(per_hour=0.25, over=dt.timedelta(hours=26))) == "0.25/h over 1d2h"


def test_a_counter_that_went_down_restarted_and_its_increase_is_the_new_total():
    memory = CounterMemory()
    memory.observe(KEY, 900, at=T0)
    assert memory.observe(KEY, 30, at=T0 + dt.timedelta(hours=1)) == Rate(per_hour=30, over=dt.timedelta(hours=1))


def test_a_clock_that_went_back_starts_again_rather_than_giving_a_negative_span():
    memory = CounterMemory()
    memory.observe(KEY, 10, at=T0)
    assert memory.observe(KEY, 20, at=T0 - dt.timedelta(minutes=30)) is None
    assert memory.observe(KEY, 20, at=T0 + dt.timedelta(minutes=30)) == Rate(per_hour=0, over=dt.timedelta(hours=1))


def test_prometheus_rates_are_one_query_of_increase_over_the_last_hour_labelled_by_counter():
    query = rates_query(node_label="Hostname", node='gpu-"a"')
    assert query == (
        'label_replace(increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{Hostname="gpu-\\"a\\""}[1h]), "gpuops_counter", '
        '"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "", "") or label_replace(increase(DCGM_FI_DEV_PCIE_REPLAY_COUNTER'
        '{Hostname="gpu-\\"a\\""}[1h]), "gpuops_counter", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "", "")')
    found = rates_from([Sample("", {"Hostname": "gpu-a", "UUID": "GPU-1", "gpuops_counter": PCIE_REPLAYS}, 12.0),
                        Sample("", {"Hostname": "gpu-a", "UUID": "GPU-1", "gpuops_counter": "OTHER"}, 5.0),
                        Sample("", {"UUID": "GPU-2", "gpuops_counter": PCIE_REPLAYS}, 5.0)], node_label="Hostname")
    assert found == {"gpu-a": {("GPU-1", PCIE_REPLAYS): Rate(per_hour=12.0, over=dt.timedelta(hours=1))}}


# --------------------------------------------------------------------------------------
# Reading the pages: the pod's node, rates over time (freezegun), unknown on failure


class Cluster:
    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.value = snapshot

    def snapshot(self, now: dt.datetime) -> ClusterSnapshot:
        return self.value


@pytest.fixture
def stand_ins():
    with StandInExporters({HEALTHY: pages({HEALTHY: "pod-hostname"})[HEALTHY], REMAP: pages()[REMAP]}) as served:
        yield served


def _service(stand_ins, *, extra_pods=(), nodes=(), **settings) -> SignalsService:
    pods = tuple(_pod(node, f"nvidia-dcgm-exporter-{node}", ip=ip) for node, ip in stand_ins.ips.items())
    settings = {"port": stand_ins.port, "timeout_seconds": 1.0, **settings}
    pages_reader = ExporterPages(settings=ExporterSettings(**settings), memory=CounterMemory(),
                                 cluster=Cluster(_snapshot(*pods, *extra_pods, nodes=nodes)))
    return SignalsService(exporters=pages_reader, thresholds=Thresholds())


def _with_replays(count: int) -> str:
    return re.sub(r"^(DCGM_FI_DEV_PCIE_REPLAY_COUNTER\{.*\}) 0$", rf"\g<1> {count}", pages()[REMAP], flags=re.M)


def test_a_page_belongs_to_the_node_of_the_pod_that_served_it_whatever_its_hostname_label(stand_ins):
    reading = _service(stand_ins).read(HEALTHY)
    assert reading.unavailable is None and list(reading.nodes) == [HEALTHY]
    (gpu,) = reading.nodes[HEALTHY].gpus  # type: ignore[index]
    assert (gpu.uuid, gpu.model, gpu.gpu_temp_c, gpu.last_xid, gpu.pcie_replays) == (T4_UUID, "Tesla T4", 25, 0, 0)
    assert gpu.pcie_replays_rate is None  # the first reading: not known yet, not zero


def test_the_replay_rate_comes_from_the_previous_reading_of_the_same_gpu(stand_ins):
    assert _with_replays(0) == pages()[REMAP] != _with_replays(25)
    service = _service(stand_ins)
    thresholds_pools = {REMAP: "serving-a"}
    with freeze_time(T0) as clock:
        first = service.read(REMAP)
        assert first.nodes[REMAP].gpus[0].pcie_replays_rate is None  # type: ignore[index]
        stand_ins.page(REMAP, _with_replays(25))
        clock.move_to(T0 + dt.timedelta(minutes=15))
        second = service.read()  # every node's reading uses the same memory
        (gpu,) = second.nodes[REMAP].gpus  # type: ignore[index]
        assert (gpu.pcie_replays, gpu.pcie_replays_rate) == (25, Rate(per_hour=100, over=dt.timedelta(minutes=15)))
        assert second.nodes[HEALTHY].gpus[0].pcie_replays_rate is None  # type: ignore[index]  # its first reading
        codes = {(f.code, f.severity) for f in service.findings(second, pools=thresholds_pools)}
        assert ("gpu-pcie-replays", "warning") in codes
        clock.move_to(T0 + dt.timedelta(minutes=75))
        third = service.read(REMAP)
    assert third.nodes[REMAP].gpus[0].pcie_replays_rate == Rate(per_hour=0, over=dt.timedelta(hours=1))  # type: ignore[index]
    assert "gpu-pcie-replays" not in {f.code for f in service.findings(third, pools=thresholds_pools)}


def test_an_exporter_that_does_not_answer_makes_its_node_unknown_and_the_rest_are_read(stand_ins):
    stand_ins.stop(REMAP)
    extra = (_pod("gpu-pending", "nvidia-dcgm-exporter-p", ip=None, phase="Pending"),)
    service = _service(stand_ins, extra_pods=extra, nodes=(HEALTHY, REMAP, "gpu-pending", "gpu-bare", "gpu-opted-out"))
    reading = service.read()
    assert reading.unavailable is None and list(reading.nodes) == [HEALTHY]
    selector = f"pods labelled app=nvidia-dcgm-exporter in namespace {NS}"
    assert reading.unknown == {
        REMAP: f"on {REMAP}: {NS}/nvidia-dcgm-exporter-{REMAP} at {stand_ins.ips[REMAP]}:{stand_ins.port} cannot be "
               "reached (Connection refused)",
        "gpu-pending": f"on gpu-pending: {NS}/nvidia-dcgm-exporter-p is Pending and has no pod IP yet",
        "gpu-bare": f"have none on gpu-bare (looked for {selector})",
    }
    assert reading.failed == {REMAP, "gpu-pending"} and not reading.known(REMAP)
    found = {f.subject: (f.code, f.severity) for f in service.findings(
        reading, pools={HEALTHY: "a", REMAP: "a", "gpu-pending": "a", "gpu-bare": "a"})}
    assert found == {REMAP: ("gpu-health-unknown", "warning"), "gpu-pending": ("gpu-health-unknown", "warning"),
                     "gpu-bare": ("gpu-health-unknown", "info")}
    one = service.read(REMAP)
    assert one.nodes == {} and one.unavailable == reading.unknown[REMAP]


def test_a_stalled_exporter_is_unknown_after_the_timeout_and_a_wrong_path_is_said(stand_ins):
    stand_ins.stall(HEALTHY)
    assert _service(stand_ins).read(HEALTHY).unavailable == (
        f"on {HEALTHY}: {NS}/nvidia-dcgm-exporter-{HEALTHY} at {stand_ins.ips[HEALTHY]}:{stand_ins.port} did not "
        "answer within 1 s")
    assert _service(stand_ins, path="/stats").read(REMAP).unavailable.endswith(  # type: ignore[union-attr]
        "answered HTTP 404 Not Found")


def test_reading_every_node_stops_at_its_deadline_and_the_pages_not_in_leave_their_nodes_unknown(stand_ins):
    stand_ins.stall(HEALTHY)
    stand_ins.stall(REMAP)
    # One page at a time, each stalled for its whole 1 s: the second cannot be in before
    # 2 s, past the 1.5 s deadline.
    first, second = sorted((HEALTHY, REMAP))
    reading = _service(stand_ins, parallel=1, deadline_seconds=1.5).read()
    assert reading.nodes == {} and reading.failed == {HEALTHY, REMAP}
    assert reading.unknown[second] == (f"on {second}: its exporter's page was not read within the 1.5 s that reading "
                                       "every node may take (signals.exporters.deadline)")
    assert first in reading.unknown


def test_without_exporter_pods_or_a_cluster_the_whole_reading_is_unavailable(stand_ins, tmp_path):
    empty = ExporterPages(settings=ExporterSettings(), memory=CounterMemory(), cluster=Cluster(_snapshot()))
    assert empty.read().unavailable == f"found none (looked for pods labelled app=nvidia-dcgm-exporter in namespace {NS})"
    assert empty.read("gpu-a-01").unavailable == (
        f"have none on gpu-a-01 (looked for pods labelled app=nvidia-dcgm-exporter in namespace {NS})")
    no_namespace = Cluster(dataclasses.replace(_snapshot(), operator_namespace=None))
    assert ExporterPages(settings=ExporterSettings(), memory=CounterMemory(), cluster=no_namespace).read(
    ).unavailable.startswith("cannot be found: the GPU Operator's namespace is not known")  # type: ignore[union-attr]
    elsewhere = ExporterPages(settings=ExporterSettings(namespace="monitoring"), memory=CounterMemory(),
                              cluster=Cluster(_snapshot(*(_pod(n, f"nvidia-dcgm-exporter-{n}") for n in "ab"))))
    assert elsewhere.read().unavailable == (
        "found none (looked for pods labelled app=nvidia-dcgm-exporter in namespace monitoring; gpuops sees the pods "
        f"of {NS}, the GPU Operator's namespace, and GPU pods only)")
    config = GpuopsConfig.model_validate({"signals": {"exporters": {}}})
    reading = config.signals.service(cluster=object()).read()  # type: ignore[union-attr]
    assert reading.source == "dcgm-exporter pods (port 9400)" and reading.nodes == {}
    assert reading.unavailable == "cannot be found: gpuops reads no pods here (it runs without the Kubernetes API)"


def test_the_token_is_read_from_its_file_on_every_scrape_and_never_said(stand_ins, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    service = _service(stand_ins, bearer_token_file=token)
    assert service.read(HEALTHY).unavailable is None
    token.write_text("rotated")
    assert service.read(HEALTHY).unavailable is None
    assert stand_ins.asked(HEALTHY) == ["Bearer s3cret-token", "Bearer rotated"]
    token.unlink()
    reason = service.read(HEALTHY).unavailable
    assert reason is not None and "cannot read its credentials" in reason and "rotated" not in reason
